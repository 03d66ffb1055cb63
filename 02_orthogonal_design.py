"""Stage 02: a strength-2 orthogonal design over the harness space -> H_tr and the held-out rest.

Training on all of H is wasteful, so we train on a small subset H_tr that is balanced in the
sense of a factorial design of strength 2 (an orthogonal array, OA):
  - component balance: every realisation of a component appears equally often in H_tr;
  - pairwise balance: for every two components, every pair of their realisations appears
    equally often (so no pair of realisations is ever seen only together with another).
Everything else of H (most full combinations) stays unseen: the in-space held-out set.

For the default 3^5 space the smallest such array has 18 runs (Rao bound 11, and 18 is the
smallest multiple of 3*3 = 9 above it; OA(9, 3^k) exists only for k <= 4), the paper's
training-set size. Constructions here, the smallest that fits is taken:
  - Taguchi's L18 for up to seven 3-level components (five use columns L18[:, 2:7]);
  - Rao-Hamming (Bose) arrays OA(s^m, s^k) for a prime number of levels s, k <= (s^m-1)/(s-1);
  - full factorials for one or two components; components with different level counts are
    built per level count and crossed (a product of strength-2 OAs is one).
Any other pattern stops with the Rao bound and the divisibility condition; then bring an array
(e.g. from Sloane's or OApackage's tables) with --design FILE. Every design, constructed or
given, goes through the strength-2 verifier before use. `--method random` draws the same
number of configurations uniformly (the paper's Random-18 ablation) for comparison.

This stage writes every harness set of the project, so the baselines' sets come from here too:
  - `--method single --harness ID`: one training harness, a configuration of the space (the base
    S0-T0-O0-C0-W0: single-harness RL) or an out-of-space harness of --external (X-shell: the
    black-box baselines); everything in the space but it is held out;
  - `--method one-factor`: the base and its one-factor-at-a-time variants (Hamming distance <= 1,
    11 configurations): the warm start's harnesses;
  - `--eval-set N --out FILE`: an experiment's shared In-Space evaluation set (below).

The In-Space evaluation set. Every configuration of 3^5 lies within Hamming distance 2 of the L18
(its covering radius is 2): of the 225 held-out configurations, 180 differ from their nearest
training harness in one component, 45 in two. A set drawn uniformly from them would be mostly
one-component neighbours of a trained harness, and a claim about held-out configurations would
rest on those. So the set is a seeded draw (--seed) stratified by distance to RUN's OA: N/2
configurations at distance 1 and N/2 at distance 2 (2 or more, for other designs), drawn from
what is left after leaving out the OA, the base, the warm start's set (the base and its one-factor
variants) and every --exclude file's harnesses (every method's training set). Each row carries its
distance_to_oa; a config beside FILE (eval_harnesses_config.json for eval_harnesses.jsonl)
records the seed and how many candidates each stratum had after each exclusion. It is written once per experiment, before any
outcome exists: a later call that would change it is refused.

Reads  RUN/components.json, RUN/harness_space.jsonl                    (stage 01)
Writes RUN/train_harnesses.jsonl, RUN/heldout_harnesses.jsonl, RUN/02_orthogonal_design_config.json
       --eval-set: only FILE and its config beside it (it reads RUN/train_harnesses.jsonl, the OA)

Commands:
    python 02_orthogonal_design.py --run runs/default                       # L18, 18 configs
    python 02_orthogonal_design.py --run runs/random18 --method random --seed 1
    python 02_orthogonal_design.py --run runs/mine --design my_oa.csv       # your own array
    python 02_orthogonal_design.py --run runs/single --method single        # H_tr = {S0-T0-O0-C0-W0}
    python 02_orthogonal_design.py --run runs/bb --method single --harness X-shell   # black-box baselines
    python 02_orthogonal_design.py --run runs/exp/warm-start --method one-factor
    python 02_orthogonal_design.py --run runs/exp/harness-scaling --eval-set 12 \
        --exclude runs/exp/single/train_harnesses.jsonl,runs/exp/spare/random18-seed0/train_harnesses.jsonl \
        --out runs/exp/eval_harnesses.jsonl
A design file has one row per training configuration, one 0-based level per component in
the order S,T,O,C,W: a JSON list of rows, or a CSV / whitespace table (an optional header line
"S,T,O,C,W", '#' comments). A table whose levels are all 1-based (no 0 anywhere) is shifted.
"""
import argparse
import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path

from common.plumbing import fail, jsonl_text, locked, read_json, read_jsonl, read_text, surrogate_field, write_atomic

# Taguchi's L18 (2^1 x 3^7), levels 1-based as published: G. Taguchi & S. Konishi, "Orthogonal
# Arrays and Linear Graphs" (ASI Press, 1987); also OA(18, 2^1 3^7, 2) in N.J.A. Sloane's
# library of orthogonal arrays. Column 0 has 2 levels, columns 1-7 have 3. Any set of its
# 3-level columns is a strength-2 OA (the verifier below checks it on every run).
L18 = [
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 2, 2, 2, 2, 2, 2],
    [1, 1, 3, 3, 3, 3, 3, 3],
    [1, 2, 1, 1, 2, 2, 3, 3],
    [1, 2, 2, 2, 3, 3, 1, 1],
    [1, 2, 3, 3, 1, 1, 2, 2],
    [1, 3, 1, 2, 1, 3, 2, 3],
    [1, 3, 2, 3, 2, 1, 3, 1],
    [1, 3, 3, 1, 3, 2, 1, 2],
    [2, 1, 1, 3, 3, 2, 2, 1],
    [2, 1, 2, 1, 1, 3, 3, 2],
    [2, 1, 3, 2, 2, 1, 1, 3],
    [2, 2, 1, 2, 3, 1, 3, 2],
    [2, 2, 2, 3, 1, 2, 1, 3],
    [2, 2, 3, 1, 2, 3, 2, 1],
    [2, 3, 1, 3, 2, 3, 1, 2],
    [2, 3, 2, 1, 3, 1, 2, 3],
    [2, 3, 3, 2, 1, 2, 3, 1],
]
# Which L18 columns k three-level components use: the first k of this list. Columns 2-6
# (0-based) have the least aliasing of main effects with two-factor interactions.
L18_COLUMNS = [2, 3, 4, 5, 6, 7, 1]
HERE = Path(__file__).resolve().parent
BASE = "S0-T0-O0-C0-W0"  # the base harness: realisation 0 of every component


# ---------------------------------------------------------------------------------------
# Args
# ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Stage 02: strength-2 orthogonal design -> train / held-out harnesses.")
    p.add_argument("--run", default="runs/default", help="run folder (reads stage 01's files, writes here)")
    g = p.add_argument_group("the training set H_tr (written to RUN)")
    g.add_argument("--method", default="oa", choices=["oa", "random", "single", "one-factor"],
                   help="oa: the orthogonal array (the paper's); random: the same number of "
                        "configurations drawn uniformly (the Random-18 ablation); single: the one harness "
                        "--harness; one-factor: the base and its one-factor-at-a-time variants (the warm start's)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random draw (method random, the random "
                   "baseline printed beside the OA, and --eval-set's draw)")
    g.add_argument("--design", default=None,
                   help="use this array instead of constructing one (JSON list of rows or a CSV / "
                        "whitespace table; 0-based levels in component order); verified before use")
    g.add_argument("--n", type=int, default=None,
                   help="method random only: how many configurations to draw (default: the OA's size)")
    g.add_argument("--harness", default=None,
                   help="method single: its harness id, in the space or in --external (default: the base "
                        f"{BASE})")
    g.add_argument("--external", default=str(HERE / "data" / "external_harnesses.json"),
                   help="method single: the out-of-space harnesses (a JSON list of harness records)")
    g = p.add_argument_group("an experiment's shared In-Space evaluation set (written to --out only)")
    g.add_argument("--eval-set", type=int, default=None, metavar="N",
                   help="write only an experiment's shared In-Space evaluation set of N harnesses to --out: N/2 at "
                        "Hamming distance 1 from RUN's training set (the OA) and N/2 at distance 2, drawn with --seed "
                        "outside the OA, the base, the warm start's set and --exclude (N even, >= 2)")
    g.add_argument("--exclude", default="", metavar="FILE[,FILE...]",
                   help="eval-set: harness files (JSONL, harness_id) whose harnesses the set leaves out: every "
                        "method's training set and the warm start's")
    g.add_argument("--out", default=None, metavar="FILE", help="eval-set: the file to write")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
class DesignError(ValueError):
    """No construction here for this level pattern (the message says what would work)."""


# ---- input checking ----
# Every file and flag is checked here, before anything is computed or written: bad input stops with one line
# naming the file, the line and the field (exit 2), and the run folder is left as it was.
def load_run(run):
    """Stage 01's outputs, checked: (order, realisations per component, space records)."""
    cpath, spath = run / "components.json", run / "harness_space.jsonl"
    comp = read_json(cpath, f" (run 01_harness_space.py --run {run} first)")
    order = comp.get("order") if isinstance(comp, dict) else None
    if not isinstance(order, list) or not isinstance(comp.get("components"), dict) \
            or any(not isinstance(comp["components"].get(c), list) or not comp["components"][c] for c in order):
        fail(f"{cpath}: fields 'order' (list) and 'components' (component -> non-empty list) are required")
    levels = [len(comp["components"][c]) for c in order]
    space, seen = [], set()
    for n, rec in read_jsonl(spath):
        for field in ("harness_id", "levels", "specs"):
            if field not in rec:
                fail(f"{spath}:{n}: field '{field}' is missing")
        lv = rec["levels"]
        if not isinstance(lv, dict) or sorted(lv) != sorted(order):
            fail(f"{spath}:{n}: field 'levels' must have exactly the keys {order}")
        for c, s in zip(order, levels):
            if not isinstance(lv[c], int) or not 0 <= lv[c] < s:
                fail(f"{spath}:{n}: field 'levels.{c}' must be an integer in 0..{s - 1}")
        key = tuple(lv[c] for c in order)
        if key in seen:
            fail(f"{spath}:{n}: field 'levels' repeats an earlier configuration")
        seen.add(key)
        space.append(rec)
    if len(space) != math.prod(levels):
        fail(f"{spath}: {len(space)} configurations, expected the full product {math.prod(levels)} "
             f"(run 01_harness_space.py --run {run} again)")
    return order, levels, space


def read_design(path, levels, names):
    """A user's array: JSON list of rows, or a CSV / whitespace table. Returns rows of 0-based levels."""
    path = Path(path)
    text = read_text(path)
    entries = []                                   # (where, row)
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            fail(f"{path}:{e.lineno}: malformed JSON ({e.msg})")
        entries = [(f"{path}, row {i + 1}", row) for i, row in enumerate(data)]
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            tokens = line.split("#")[0].replace(",", " ").split()
            if not tokens or (not entries and tokens == names):
                continue
            try:
                entries.append((f"{path}:{n}", [int(t) for t in tokens]))
            except ValueError:
                fail(f"{path}:{n}: expected {len(names)} integer levels, got {line.strip()!r}")
    if not entries:
        fail(f"{path}: no rows")
    for where, row in entries:
        if not isinstance(row, list) or len(row) != len(names) or not all(isinstance(v, int) for v in row):
            fail(f"{where}: expected {len(names)} integer levels (one per component {names}), got {row!r}")
    if all(v >= 1 for _, row in entries for v in row) and \
            all(v <= s for _, row in entries for v, s in zip(row, levels)):
        print(f"note: {path} has no level 0, read as 1-based levels (shifted down by one)")
        entries = [(where, [v - 1 for v in row]) for where, row in entries]
    first_seen = {}
    for where, row in entries:
        for v, s, c in zip(row, levels, names):
            if not 0 <= v < s:
                fail(f"{where}: column {c}: level {v} is out of range 0..{s - 1}")
        if tuple(row) in first_seen:
            fail(f"{where}: repeats {first_seen[tuple(row)]} (a training set holds each configuration once)")
        first_seen[tuple(row)] = where.replace(f"{path}:", "line ").replace(f"{path}, ", "")
    return [row for _, row in entries]


def read_ids(path):
    """[(line number, harness id)] of a harness file (JSONL records with a string field harness_id)."""
    out = []
    for n, rec in read_jsonl(path):
        if not isinstance(rec.get("harness_id"), str):
            fail(f"{path}:{n}: field 'harness_id' is missing or not a string")
        out.append((n, rec["harness_id"]))
    return out


def read_external(path):
    """{harness id: record} of the out-of-space harnesses (a JSON list of harness records, or one record)."""
    data = read_json(path)
    out = {}
    for i, rec in enumerate(data if isinstance(data, list) else [data], start=1):
        if not isinstance(rec, dict) or not isinstance(rec.get("harness_id"), str):
            fail(f"{path}, entry {i}: field 'harness_id' is missing or not a string")
        field = surrogate_field(rec)
        if field:
            fail(f"{path}, entry {i}: field '{field}': a lone UTF-16 surrogate (e.g. \\ud800) is not text")
        out[rec["harness_id"]] = rec
    return out


def check_flags(args):
    """Which flags go together."""
    if args.n is not None and (args.method != "random" or args.n < 1):
        fail(f"--n {args.n}: only with --method random, and at least 1")
    if args.harness is not None and args.method != "single":
        fail(f"--harness {args.harness}: only with --method single")
    if args.design and args.method not in ("oa", "random"):
        fail(f"--design: only with --method oa or random, not {args.method}")
    if args.eval_set is None and (args.exclude or args.out):
        fail("--exclude and --out go with --eval-set N")
    if args.eval_set is not None and (args.eval_set < 2 or args.eval_set % 2):
        fail(f"--eval-set {args.eval_set}: N must be even and >= 2 (half of the set at distance 1 from the OA, "
             "half at distance 2)")
    if args.eval_set is not None and not args.out:
        fail(f"--eval-set {args.eval_set}: needs --out FILE")
    if args.eval_set is not None and (args.method != "oa" or args.design or args.harness):
        fail("--eval-set writes only the evaluation set: no --method, --design or --harness with it")


# ---- the algorithm ----
# ---------------------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------------------
def rao_bound(levels):
    # Rao bound for strength 2: N >= 1 + sum_i (s_i - 1)
    return 1 + sum(s - 1 for s in levels)


def divisor(levels):
    """Every N of a strength-2 design is a multiple of this: lcm of s_i*s_j over column pairs."""
    # each level pair of columns i, j appears N / (s_i s_j) times  =>  N % (s_i * s_j) == 0
    products = [a * b for a, b in itertools.combinations(levels, 2)] or levels
    return math.lcm(*products)


def smallest_possible_n(levels):
    """The smallest N allowed by the Rao bound and divisibility (a lower bound, not a promise)."""
    d = divisor(levels)
    return d * math.ceil(rao_bound(levels) / d)


# ---------------------------------------------------------------------------------------
# Constructions
# ---------------------------------------------------------------------------------------
def is_prime(n):
    return n >= 2 and all(n % p for p in range(2, int(n ** 0.5) + 1))


def rao_hamming(s, k):
    """OA(s^m, s^k, 2) for prime s: rows are the vectors x of GF(s)^m, columns k points of PG(m-1, s)."""
    m = 1
    while (s ** m - 1) // (s - 1) < k:
        m += 1
    vectors = list(itertools.product(range(s), repeat=m))
    # projective points: nonzero vectors whose first nonzero coordinate is 1; unit vectors first
    units = [tuple(int(i == j) for j in range(m)) for i in range(m)]
    points = units + [v for v in vectors if any(v) and v[[x != 0 for x in v].index(True)] == 1 and v not in units]
    columns = points[:k]
    # a(x, c) = x . c  (mod s): two columns c, c' are linearly independent, so the pair
    # (x.c, x.c') takes each of the s^2 values for exactly s^(m-2) of the s^m rows
    rows = [[sum(a * b for a, b in zip(x, c)) % s for c in columns] for x in vectors]
    return f"Rao-Hamming OA({s ** m}, {s}^{k}) over GF({s})^{m}", rows


def construct_group(s, k):
    """(name, rows) of the smallest construction here for k components with s levels, or None."""
    candidates = []
    if s == 1:
        candidates.append(("constant column", [[0] * k]))
    if k <= 2:
        candidates.append((f"full factorial {s}^{k}", [list(r) for r in itertools.product(range(s), repeat=k)]))
    if is_prime(s):
        candidates.append(rao_hamming(s, k))
    if s == 3 and k <= 7:
        cols = L18_COLUMNS[:k]
        candidates.append((f"Taguchi L18 columns {[c + 1 for c in cols]}", [[row[c] - 1 for c in cols] for row in L18]))
    return min(candidates, key=lambda c: len(c[1])) if candidates else None


def construct_oa(levels, names):
    """A strength-2 OA for the level pattern: one construction per level count, crossed."""
    groups = {}
    for i, s in enumerate(levels):
        groups.setdefault(s, []).append(i)
    parts = []
    for s, cols in groups.items():
        built = construct_group(s, len(cols))
        if built is None:
            who = ",".join(names[i] for i in cols)
            raise DesignError(
                f"no construction here for {len(cols)} components with {s} levels ({who}): this script "
                f"builds full factorials (1-2 components), Rao-Hamming arrays (prime number of levels) "
                f"and Taguchi's L18 (up to seven 3-level components). A strength-2 design for levels "
                f"{dict(zip(names, levels))} needs N >= 1 + sum(s_i - 1) = {rao_bound(levels)} runs "
                f"(Rao bound) and N divisible by s_i*s_j for every pair of components (so by "
                f"{divisor(levels)}): N >= {smallest_possible_n(levels)}. Find such an array (e.g. in "
                f"Sloane's or OApackage's tables) and pass it with --design FILE.")
        parts.append((cols, built))
    # Crossing OAs A and B (every row of A with every row of B) keeps strength 2: a level pair
    # within A appears N_B times as often, and across A and B each column is balanced, so
    # a pair (a, b) appears (N_A / s_a) * (N_B / s_b) times.
    rows = []
    for combo in itertools.product(*[built[1] for _, built in parts]):
        row = [0] * len(levels)
        for (cols, _), part_row in zip(parts, combo):
            for c, v in zip(cols, part_row):
                row[c] = v
        rows.append(row)
    name = " x ".join(f"{built[0]} on {','.join(names[i] for i in cols)}" for cols, built in parts)
    return name, rows


# ---------------------------------------------------------------------------------------
# The verifier
# ---------------------------------------------------------------------------------------
def check_design(rows, levels, names):
    """Strength-2 check plus component balance, Rao bound, divisibility and pairwise coverage."""
    n = len(rows)
    report = {"n": n, "rao_bound": rao_bound(levels), "divisor": divisor(levels), "failures": []}
    report["rao_ok"] = n >= report["rao_bound"]
    report["divisible_ok"] = n % report["divisor"] == 0
    report["balance"] = {c: [sum(r[i] == a for r in rows) for a in range(s)]
                         for i, (c, s) in enumerate(zip(names, levels))}
    report["balance_ok"] = all(len(set(counts)) == 1 for counts in report["balance"].values())
    covered = total = 0
    pair_counts = []
    for i, j in itertools.combinations(range(len(levels)), 2):
        counts = Counter((r[i], r[j]) for r in rows)
        cells = list(itertools.product(range(levels[i]), range(levels[j])))
        # strength 2: every level pair (a, b) of columns i, j appears N / (s_i s_j) times
        expected = n / (levels[i] * levels[j])
        bad = [ab for ab in cells if counts[ab] != expected]
        if bad:
            table = " ".join(f"{a}{b}:{counts[(a, b)]}" for a, b in cells)
            report["failures"].append(
                f"columns {names[i]} and {names[j]}: level pair {bad[0]} appears {counts[bad[0]]} "
                f"time{'' if counts[bad[0]] == 1 else 's'}, "
                f"expected {expected:g} (counts {table})")
        covered += sum(counts[ab] > 0 for ab in cells)
        total += len(cells)
        pair_counts += [counts[ab] for ab in cells]
    report.update(covered=covered, total_pairs=total, strength2_ok=not report["failures"],
                  pair_count_min=min(pair_counts, default=0), pair_count_max=max(pair_counts, default=0))
    return report


def expected_random_coverage(levels, n):
    """Exact mean pairwise coverage of a uniform n-subset of the full product (no replacement)."""
    size = math.prod(levels)
    hit = total = 0.0
    for a, b in itertools.combinations(levels, 2):
        # a level pair lies in size/(a b) configurations; P(missed) = C(size - size/(ab), n) / C(size, n)
        p_miss = math.comb(size - size // (a * b), n) / math.comb(size, n)
        hit += a * b * (1 - p_miss)
        total += a * b
    return hit / total if total else 1.0


def print_comparison(columns):
    """Side-by-side report of a few designs: [(title, report)]."""
    def yes(ok):
        return "yes" if ok else "NO"
    lines = [("runs N", lambda r: str(r["n"])),
             ("Rao bound N >= 1+sum(s_i-1)", lambda r: f"{r['rao_bound']} {yes(r['rao_ok'])}"),
             ("N divisible by s_i*s_j", lambda r: f"{r['divisor']} {yes(r['divisible_ok'])}"),
             ("component balance", lambda r: yes(r["balance_ok"])),
             ("strength 2 (pairwise balance)", lambda r: yes(r["strength2_ok"]) if r["strength2_ok"]
              else f"NO ({len(r['failures'])} column pairs)"),
             ("pairwise coverage", lambda r: f"{r['covered']}/{r['total_pairs']} = {100 * r['covered'] / max(r['total_pairs'], 1):.1f}%"),
             ("times a level pair appears", lambda r: f"{r['pair_count_min']}..{r['pair_count_max']}")]
    width = max(24, *(len(t) + 2 for t, _ in columns))
    print((f"{'':<32}" + "".join(f"{t:<{width}}" for t, _ in columns)).rstrip())
    for label, fn in lines:
        print((f"{label:<32}" + "".join(f"{fn(r):<{width}}" for _, r in columns)).rstrip())


# ---------------------------------------------------------------------------------------
# The other harness sets: one harness, the warm start's, an experiment's evaluation set
# ---------------------------------------------------------------------------------------
def one_factor_ids(space):
    """The base harness and its one-factor-at-a-time variants: the configurations at Hamming distance <= 1."""
    return [h["harness_id"] for h in space if sum(v != 0 for v in h["levels"].values()) <= 1]


def distance_to_oa(space, oa_ids):
    """{harness id: Hamming distance to the nearest configuration of the OA} for every configuration of the space."""
    comps = list(space[0]["levels"])
    oa = [h["levels"] for h in space if h["harness_id"] in oa_ids]
    distance = {}
    for h in space:
        # the number of components on which h differs from a row, minimised over the OA's rows
        distance[h["harness_id"]] = min(sum(h["levels"][c] != row[c] for c in comps) for row in oa)
    return distance


def eval_strata(space, oa_ids, left_out):
    """The candidates of an evaluation set: the configurations outside the OA and `left_out`, by Hamming distance to
    the OA -> {1: [...], 2: [...]}, records (sorted by id) with their distance_to_oa. Stratum 2 also holds any
    configuration farther away (none for the L18 over 3^5, whose every configuration lies within 2 of it)."""
    distance = distance_to_oa(space, oa_ids)
    strata = {1: [], 2: []}
    for h in sorted(space, key=lambda h: h["harness_id"]):
        d = distance[h["harness_id"]]
        if d >= 1 and h["harness_id"] not in left_out:
            strata[min(d, 2)].append(dict(h, distance_to_oa=d))
    return strata


def shared_eval_set(space, oa_ids, exclude, n, seed):
    """The experiment's In-Space evaluation set: n/2 configurations at distance 1 from the OA and n/2 at distance 2,
    a seeded draw outside the OA, the base, the warm start's set (the base and its one-factor variants) and
    `exclude`. Equal counts, so that the few configurations two components away from every training harness weigh
    as much in the held-out score as the many one component away. Sorted by distance, then id."""
    left_out = set(exclude) | {BASE} | set(one_factor_ids(space))
    strata = eval_strata(space, oa_ids, left_out)
    rng = random.Random(seed)
    drawn = rng.sample(strata[1], n // 2) + rng.sample(strata[2], n // 2)
    return sorted(drawn, key=lambda h: (h["distance_to_oa"], h["harness_id"]))


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    writes_to = Path(args.out).parent if args.eval_set is not None and args.out else Path(args.run)
    with locked(writes_to / "run.lock"):  # one writer per folder
        return run_stage(args)


def run_stage(args):
    run = Path(args.run)
    check_flags(args)
    order, levels, space = load_run(run)
    if args.eval_set is not None:
        return write_eval_set(args, run, space)
    if args.method == "single":
        train, oa_name, reports = [single_harness(args, run, space)], None, {}
    elif args.method == "one-factor":
        ids = set(one_factor_ids(space))
        train, oa_name, reports = [h for h in space if h["harness_id"] in ids], None, {}
        print(f"space: {len(space)} configurations; H_tr: the base and its one-factor-at-a-time variants")
    else:
        train, oa_name, reports = designed_set(args, order, levels, space)

    # H_tr and H \ H_tr (an out-of-space training harness leaves the whole space held out)
    train_ids = {h["harness_id"] for h in train}
    heldout = [h for h in space if h["harness_id"] not in train_ids]
    config = {"stage": "02_orthogonal_design", "args": vars(args), "order": order, "levels": levels,
              "method": args.method, "oa_construction": oa_name, "n_train": len(train),
              "n_heldout": len(heldout), "train_harness_ids": [h["harness_id"] for h in train], **reports}
    outputs = {"heldout_harnesses.jsonl": jsonl_text(heldout),  # train_harnesses.jsonl last: it marks 02 done
               "02_orthogonal_design_config.json": json.dumps(config, indent=1) + "\n",
               "train_harnesses.jsonl": jsonl_text(train)}
    for name, text in outputs.items():
        write_atomic(run / name, text)
    print(f"H_tr: {len(train)} configurations ({args.method}), held out: {len(heldout)}; wrote "
          + ", ".join(str(run / name) for name in outputs))


def designed_set(args, order, levels, space):
    """--method oa / random: the OA (the user's --design, or constructed; verified either way) and the random
    baseline of the same size, both reported; -> (H_tr records, the OA's name, the reports for the config)."""
    by_key = {tuple(h["levels"][c] for c in order): h for h in space}
    # 1. The orthogonal array: the user's (--design) or constructed; verified either way.
    oa_rows, oa_name = None, None
    if args.design:
        oa_rows, oa_name = read_design(args.design, levels, order), f"design file {args.design}"
    else:
        try:
            oa_name, oa_rows = construct_oa(levels, order)
        except DesignError as e:
            if args.method == "oa" or args.n is None:
                fail(str(e))
    if oa_rows is not None and len({tuple(r) for r in oa_rows}) != len(oa_rows):
        fail(f"{oa_name} repeats a row (a training set holds each configuration once)")
    oa_report = check_design(oa_rows, levels, order) if oa_rows is not None else None
    if oa_report is not None and not oa_report["strength2_ok"]:
        fail(f"{oa_name} is not a strength-2 orthogonal array: {oa_report['failures'][0]}"
             + (f" (and {len(oa_report['failures']) - 1} more column pairs)" if len(oa_report["failures"]) > 1 else ""))
    if oa_report is not None and len(oa_rows) == len(space):
        print(f"warning: the design has every configuration ({len(space)}): nothing is held out")

    # 2. The random baseline: the same number of configurations, drawn uniformly (seeded).
    n = args.n or len(oa_rows)
    if n > len(space):
        fail(f"--n {n} is larger than the space ({len(space)} configurations)")
    rng = random.Random(args.seed)
    random_rows = [list(key) for key in rng.sample(sorted(by_key), n)]
    random_report = check_design(random_rows, levels, order)

    # 3. Report the chosen H_tr.
    train_rows = oa_rows if args.method == "oa" else random_rows
    print(f"space: {len(space)} configurations, levels " + " x ".join(f"{c}:{s}" for c, s in zip(order, levels)))
    print(f"orthogonal array: {oa_name or 'none constructed'}")
    columns = ([(f"OA ({len(oa_rows)} runs)", oa_report)] if oa_report else []) + \
              [(f"random-{n} (seed {args.seed})", random_report)]
    print_comparison(columns)
    expected = expected_random_coverage(levels, n)
    print(f"expected coverage of a uniform random {n}-subset: {100 * expected:.1f}% (exact)")
    lower = smallest_possible_n(levels)
    if oa_report:
        print(f"smallest N allowed by the Rao bound and divisibility: {lower}"
              + (" (this design reaches it)" if len(oa_rows) == lower else f" (this design: {len(oa_rows)})"))
    chosen = oa_report if args.method == "oa" else random_report
    print("balance of H_tr, times each realisation appears: "
          + "  ".join(f"{c}:{'/'.join(map(str, counts))}" for c, counts in chosen["balance"].items()))
    for msg in ([] if chosen["strength2_ok"] else chosen["failures"][:3]):
        print(f"  unbalanced: {msg}")
    reports = {"oa_report": oa_report, "random_report": random_report, "expected_random_coverage": expected,
               "smallest_possible_n": lower}
    return [by_key[tuple(r)] for r in train_rows], oa_name, reports


def single_harness(args, run, space):
    """--method single: the record of --harness, a configuration of the space (the base: single-harness RL) or an
    out-of-space harness of --external (X-shell: the black-box baselines train inside it)."""
    hid = args.harness or BASE
    found = {h["harness_id"]: h for h in space}.get(hid) or read_external(args.external).get(hid)
    if found is None:
        fail(f"--harness {hid}: neither a configuration of {run / 'harness_space.jsonl'} nor a harness of "
             f"{args.external}")
    print(f"space: {len(space)} configurations; H_tr: {hid} alone")
    return found


def write_eval_set(args, run, space):
    """--eval-set N: the experiment's shared In-Space set, stratified by distance to RUN's OA (its
    train_harnesses.jsonl), disjoint from it, from the base, the warm start's set and every --exclude file; written
    once: a second call that would change it is refused. Prints how many candidates each stratum has after each
    exclusion, and writes that with the seed into FILE_config.json."""
    in_space = {h["harness_id"] for h in space}
    oa_path = run / "train_harnesses.jsonl"
    oa_ids = set()
    for n, hid in read_ids(oa_path):
        if hid not in in_space:
            fail(f"{oa_path}:{n}: field 'harness_id': {hid} is not a configuration of the space (the "
                 "evaluation set is stratified by distance to an in-space training set, the OA)")
        oa_ids.add(hid)

    # What the set leaves out, one step at a time: the stratum sizes after each step are printed and recorded
    steps = [("outside the OA", set()),
             ("less the base and the warm start's set", {BASE} | set(one_factor_ids(space)))]
    for path in filter(None, args.exclude.split(",")):
        steps.append((f"less {path}", {hid for _, hid in read_ids(path)}))
    left_out, sizes = set(), []
    print(f"candidates by Hamming distance to the OA of {oa_path} (distance 1 / 2):")
    for label, ids in steps:
        left_out |= ids
        strata = eval_strata(space, oa_ids, left_out)
        sizes.append({"step": label, "distance_1": len(strata[1]), "distance_2": len(strata[2])})
        print(f"  {len(strata[1]):4d} / {len(strata[2]):3d}  {label}")
    n_max = 2 * min(len(strata[1]), len(strata[2]))
    if args.eval_set > n_max:
        fail(f"--eval-set {args.eval_set}: at most {n_max} here (twice the smaller stratum: {len(strata[1])} "
             f"candidates at distance 1, {len(strata[2])} at distance 2)")

    rows = shared_eval_set(space, oa_ids, left_out, args.eval_set, args.seed)
    ids = [h["harness_id"] for h in rows]
    out = Path(args.out)
    config_path = out.with_name(out.stem + "_config.json")
    old = [hid for _, hid in read_ids(out)] if out.is_file() else None
    if old is not None and sorted(old) != sorted(ids):
        fail(f"{out}: the evaluation set would change (the training sets or --seed changed?); delete it or choose "
             "another --out")
    if old is None:
        config = {"stage": "02_orthogonal_design --eval-set", "args": vars(args), "oa": str(oa_path),
                  "n": args.eval_set, "seed": args.seed, "strata": sizes,
                  "distance_to_oa": {h["harness_id"]: h["distance_to_oa"] for h in rows}}
        write_atomic(config_path, json.dumps(config, indent=1) + "\n")
        write_atomic(out, jsonl_text(rows))  # the set last: it marks the step done
    print(f"evaluation set: {len(rows)} in-space harnesses (seed {args.seed}), half at distance 1 from the OA, half "
          f"at distance 2; {len(left_out | oa_ids)} configurations left out:")
    for h in rows:
        print(f"  {h['harness_id']}  distance {h['distance_to_oa']}")
    print(f"wrote {out} and {config_path}" if old is None else f"{out} unchanged")

if __name__ == "__main__":
    main()
