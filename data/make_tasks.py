"""make_tasks.py: the seeded generator of the default workspace tasks (train and test sets).

    python data/make_tasks.py                       # writes data/train_tasks.jsonl and data/test_tasks.jsonl
    python data/make_tasks.py --seed 1 --n-train 600 --n-test 200 --out-dir /tmp/tasks
    python -m pytest -q -s tests/test_task_floors.py   # the guessing floors of the committed sets, per family

Same seed, same files (the committed sets are made with the defaults). The generator only
writes data; the environment that runs and scores the tasks lives in common/environment.py (04_rollout.py runs it).

Task schema (one JSON object per line; bring your own tasks in the same shape):

    {"task_id": "lookup-train-0007",          unique id (string)
     "family": "lookup",                      free-form label used in summaries
     "request": "What is the code in river.txt? Answer with the number.",   the first user message
     "files": {"river.txt": "pin: 58\\ncode: 417", "stone.txt": "code: 38"},   the workspace {path: text}
     "checker": {"type": "answer_equals", "value": "417"},           how the episode is scored
     "solution": [{"tool": "read_file", "args": {"path": "river.txt"}},   optional: canonical calls
                  {"tool": "submit", "args": {"answer": "417"}}],         the oracle replays
     "difficulty": {"distractors": 1}}        optional, informational

checker types (reward = success = 1 when the checker passes, else 0: pass/fail, no partial credit):
    answer_equals {value}        the submitted answer equals value (trimmed, case-folded,
                                 whitespace collapsed, a trailing '.' dropped; numbers compared as numbers)
    answer_set    {values}       the submitted answer, split on commas / semicolons / whitespace / the word "and",
                                 is the set of values (each item compared as answer_equals does; order free)
    file_equals   {path, value}  the file's final text equals value (surrounding whitespace ignored)
    file_contains {path, value}  the file's final text contains value
    all           {checks: [...]} passes when every sub-check passes (04 keeps each one's 0/1 in `checks`)
Canonical tools for `solution`: list_files(), read_file(path), search(query),
write_file(path, content), calculator(expression), submit(answer).

Families (all entities come from small fixed pools so a small BPE makes them single tokens). The request never
holds the answer, and no answer is one that a guess could hit often (see "Guessing floors" below):
    lookup    read the file the request names and submit one key's value; 1-3 distractor files carry the same
              key with other values, and the named file holds 1-3 other keys as well
    search    "One file mentions the ANIMAL. What is the KEY in it?": search for the animal, read that file,
              submit the value; 3-5 distractors carry the same key and mention other animals, and the file
              holds 1-3 other keys
    sum       read 2 named files (the asked key their only key), add the values with the calculator, submit
              the sum (0-2 distractors carry the key too; the sum is never a number of the workspace)
    edit      set a value in a multi-line file (read it, write it back with one line changed), or copy
              a line to a new file; then answer "done" (a guess that writes nothing fails)
    multihop  follow "next: FILE" links for 2-3 hops, submit the value at the end; 1-2 distractors, the first
              of which carries the asked key too (a search for the key finds two files: the links must be followed)
    count     "Which files have a KEY line?": search for "KEY:", submit the 4-6 matching names among 6-9 files
              (answer_set); at least 2 files do not match, so "all the files" is wrong too
Files are records of 1-11 short lines: "key: value" lines (every number of a task is distinct, and
numbers appear only there), at most one "seen: the ANIMAL by the NAME" line (an animal is mentioned in
one file only), and "tags: NAME NAME ..." filler lines. In about half of the tasks that read files (a
quarter of the edits), a file the oracle solution reads is long (over 300 characters), so a harness that
cuts outputs at 300 characters hides its tail, and line numbers, windows and elision change what a policy
sees. The lines a solution needs always end within the first NEEDED_WITHIN = 250 characters of their file,
so they survive every cut in the harness space (300) and the out-of-space harnesses (500-1000, line numbers
included): every task stays solvable under every harness. Edited files are short (<= 250 characters), so the whole file
that must be written back is visible.
Difficulty: the number of distractor files, the hop count, the files to tell apart; the knobs calibrated on
training tasks (the warm start should solve 10-70% of each family) are the constants below (SUM_TERMS, ...).
Train and test sets are disjoint: no test task has the same family, request, files and
checker as a train task (content is compared, not ids).

Guessing floors (tests/test_task_floors.py; docs/metrics.md has the table): a task must be solved, not guessed.
On every family's test tasks, each of these passes at most 5%: the constant answer that passes the most training
tasks of the family, a random file name of the workspace, a random subset of its file names, and any answer
readable from the request (a word, number or file name of it, or all of it). Why the families look as they do:
    - answers are values from a pool of 105 numbers (or sets of file names), never a small count: the old
      "How many files?" (2-5) was passed 8 times in 20 by the constant "4";
    - an answer is never one file name: the old "Which file mentions the ANIMAL?" was passed by a random
      file name 1 time in 2-4 (37% of its test tasks); the search family now submits the value in that file;
    - a set of 4-6 names among 6-9 files is hit by a random subset of the files about 1 time in 60 at worst.
"""
import argparse
import json
import os
import random
import sys
from pathlib import Path

NAMES = ["river", "stone", "cloud", "apple", "tiger", "maple", "ocean", "forest", "garden", "silver",
         "candle", "rocket", "pepper", "winter", "summer", "violet", "copper", "harbor", "meadow",
         "falcon", "lemon", "island", "bridge", "castle"]
KEYS = ["code", "pin", "port", "size", "price", "level"]
# A fixed pool of values in 10-999 (small, so each value is frequent enough to become one token).
VALUES = [12, 17, 23, 31, 38, 42, 47, 55, 58, 64, 71, 76, 83, 89, 94, 105, 118, 126, 137, 142,
          159, 163, 174, 188, 196, 203, 217, 225, 238, 246, 251, 264, 279, 283, 295, 307, 312, 326,
          338, 341, 356, 369, 374, 387, 392, 405, 417, 428, 436, 449, 453, 467, 472, 486, 491, 508,
          514, 529, 537, 542, 556, 563, 578, 585, 599, 604, 613, 627, 632, 648, 655, 661, 679, 684,
          693, 706, 712, 725, 739, 743, 758, 764, 771, 786, 792, 805, 819, 826, 834, 847, 853, 862,
          871, 888, 894, 907, 913, 926, 938, 945, 956, 963, 971, 984, 999]
ANIMALS = ["owl", "fox", "bee", "cat", "elk", "ant", "yak", "eel", "cow", "pig", "bat", "emu"]
FAMILIES = ["lookup", "sum", "edit", "multihop", "search", "count"]
LONG = 300  # a long file has more characters than this (O2 cuts tool output at 300)
NEEDED_WITHIN = 250  # the lines a solution needs end within this many characters of their file
# Terms of a sum task, calibrated on training tasks (results/calibration): with 2-3 terms the warm start solved
# 1 of 20 sum training tasks on the base harness (the band is 10-70%), most 3-term ones failing at the calculator.
SUM_TERMS = 2
# and, from the same calibration with sum at 2 terms, the two families above the band: multihop solved 15 / 20 with
# 1-3 hops, count 17 / 20 with 2-4 matching files of 4-7
MULTIHOP_HOPS = (2, 3)
# and, from the third round (12 demonstration tasks): sum 1 / 20 (a wrong key's value added), search 19 / 20,
# count 17 / 20 with 3-5 matching files
SUM_OTHER_KEYS = 0  # other key lines in a sum's term files: the asked key is the only one there
SEARCH_DISTRACTORS = (3, 5)
COUNT_MATCHING = (4, 6)  # matching files of a count task; 2-3 more do not match


def call(tool, **args):
    return {"tool": tool, "args": args}


def files_of(names):
    return [n + ".txt" for n in names]


def sorted_files(files):
    """The workspace in name order, so that the file holding the answer is not always the first one stored."""
    return {name: files[name] for name in sorted(files)}


class Pools:
    """Draws without replacement within one task: every number and animal is distinct."""

    def __init__(self, rng):
        self.rng = rng
        self.values = rng.sample(VALUES, len(VALUES))
        self.animals = rng.sample(ANIMALS, len(ANIMALS))

    def value(self):
        return self.values.pop()

    def reserve(self, number):
        """No later draw gives `number` (e.g. a sum that must not appear in any file)."""
        if number in self.values:
            self.values.remove(number)

    def animal(self):
        return self.animals.pop()

    def key_lines(self, n, avoid=()):
        """n "key: value" lines, with distinct keys not in `avoid`."""
        keys = self.rng.sample([k for k in KEYS if k not in avoid], n)
        return [f"{k}: {self.value()}" for k in keys]

    def tags(self, fewest=4):
        """A filler line of 4-6 names (`fewest`-6)."""
        return "tags: " + " ".join(self.rng.sample(NAMES, self.rng.randint(fewest, 6)))


def record(pools, needed=(), extra=(), avoid=(), long=False, seen=None, short=False, other_keys=2):
    """A file's text: the `needed` lines (each ending within NEEDED_WITHIN characters), the `extra` lines,
    0 to `other_keys` other key lines (no key of `avoid` or of the lines above), a 'seen: the ANIMAL by the NAME' line
    when `seen` names an animal, and tags lines: 0-1 (none when short), or as many as make the file longer
    than LONG characters (long)."""
    rng = pools.rng
    used = {line.split(":")[0] for line in list(needed) + list(extra)} | set(avoid)
    lines = list(extra) + pools.key_lines(rng.randint(0, other_keys), avoid=used)
    if seen:
        lines.append(f"seen: the {seen} by the {rng.choice(NAMES)}")
    if not short:
        lines += [pools.tags() for _ in range(rng.randint(0, 1))]
    rng.shuffle(lines)
    for k, line in enumerate(needed):  # each at a random place where it ends within NEEDED_WITHIN characters,
        # keeping room for the needed lines placed after it (one of them may go before it and push it down)
        room = NEEDED_WITHIN - sum(len(later) + 1 for later in needed[k + 1:])
        fits = [i for i in range(len(lines) + 1) if sum(len(x) + 1 for x in lines[:i]) + len(line) <= room]
        lines.insert(rng.choice(fits), line)
    while not lines or (long and len("\n".join(lines)) <= LONG):
        lines.append(pools.tags(fewest=5))  # longer filler lines keep a long file within 11 lines
    return "\n".join(lines)


def make_lookup(rng):
    """Read the file the request names; submit the value of the asked key. What makes it hard: 1-3 distractor
    files carry the same key with other values, and the named file has 1-3 other keys (the right line matters)."""
    p, d = Pools(rng), rng.randint(1, 3)
    target, *others = files_of(rng.sample(NAMES, d + 1))
    key = rng.choice(KEYS)
    value = p.value()
    other_keys = p.key_lines(1, avoid=[key])  # and record() adds 0-2 more
    files = {target: record(p, [f"{key}: {value}"], extra=other_keys, long=rng.random() < 0.5)}
    for name in others:  # distractors: the same key with another value
        files[name] = record(p, [f"{key}: {p.value()}"], long=rng.random() < 0.3)
    answer = str(value)
    return {"request": f"What is the {key} in {target}? Answer with the number.",
            "files": sorted_files(files),
            "checker": {"type": "answer_equals", "value": answer},
            "solution": [call("read_file", path=target), call("submit", answer=answer)],
            "difficulty": {"distractors": d}}


def make_search(rng):
    """One file mentions an animal: find it (search), read it, submit the asked key's value there. What makes it
    hard: SEARCH_DISTRACTORS files carry the same key with other values and mention other animals, so only the
    file the search finds holds the answer, and that file has 1-3 other keys (the right line matters, as in
    lookup). (The answer is a value, not the file name: a random file name would pass 1 time in 4-6.)"""
    p, d = Pools(rng), rng.randint(*SEARCH_DISTRACTORS)
    target, *others = files_of(rng.sample(NAMES, d + 1))
    key, animal = rng.choice(KEYS), p.animal()
    value = p.value()
    # both lines the solution needs (the animal and the value) end within NEEDED_WITHIN characters
    seen = f"seen: the {animal} by the {rng.choice(NAMES)}"
    other_keys = p.key_lines(rng.randint(1, 3), avoid=[key])
    files = {target: record(p, [f"{key}: {value}", seen], extra=other_keys, avoid=[key], long=rng.random() < 0.5,
                            other_keys=0)}  # within 11 lines
    for name in others:  # distractors: the same key with another value, another animal
        files[name] = record(p, [f"{key}: {p.value()}"], long=rng.random() < 0.3, seen=p.animal())
    answer = str(value)
    solution = [call("search", query=animal), call("read_file", path=target), call("submit", answer=answer)]
    return {"request": f"One file mentions the {animal}. What is the {key} in it? Answer with the number.",
            "files": sorted_files(files),
            "checker": {"type": "answer_equals", "value": answer},
            "solution": solution,
            "difficulty": {"distractors": d}}


def make_sum(rng):
    """Read SUM_TERMS named files, add the asked key's values with the calculator, submit the sum. 0-2 distractors
    carry the key too. The sum is never a number of the workspace, so no value copied from a file is right."""
    p, n, d = Pools(rng), SUM_TERMS, rng.randint(0, 2)
    names = files_of(rng.sample(NAMES, n + d))
    key = rng.choice(KEYS)
    terms = [p.value() for _ in range(n)]
    p.reserve(sum(terms))
    long = rng.randrange(2 * n)  # about half of the tasks have one long term file
    files = {}
    for i, (name, v) in enumerate(zip(names, terms)):
        files[name] = record(p, [f"{key}: {v}"], long=i == long, other_keys=SUM_OTHER_KEYS)
    for name in names[n:]:  # distractors: the same key, not named in the request
        files[name] = record(p, [f"{key}: {p.value()}"])
    total = str(sum(terms))
    listed = ", ".join(names[:n - 1]) + " and " + names[n - 1]
    solution = [call("read_file", path=f) for f in names[:n]]
    solution += [call("calculator", expression="+".join(map(str, terms))), call("submit", answer=total)]
    return {"request": f"Add the {key} in {listed}. Answer with the sum.",
            "files": sorted_files(files),
            "checker": {"type": "answer_equals", "value": total},
            "solution": solution,
            "difficulty": {"distractors": d, "terms": n}}


def make_edit(rng):
    """Change the workspace, then answer "done": the checker needs the file written, so an answer alone fails."""
    p, d = Pools(rng), rng.randint(0, 2)
    key = rng.choice(KEYS)
    if rng.random() < 0.5:  # set a value in place: read the file, write it back with one line changed
        target, *others = files_of(rng.sample(NAMES, d + 1))
        old, new = p.value(), p.value()
        other_keys = p.key_lines(rng.randint(1, 2), avoid=[key])
        text = record(p, [f"{key}: {old}"], extra=other_keys, short=True)
        content = text.replace(f"{key}: {old}", f"{key}: {new}")
        files = {target: text}
        for name in others:
            files[name] = record(p, [f"{key}: {p.value()}"])
        request = f"Set the {key} in {target} to {new}, keep the other lines. Then answer done."
        solution = [call("read_file", path=target), call("write_file", path=target, content=content),
                    call("submit", answer="done")]
    else:  # copy a line to a new file
        src, target, *others = files_of(rng.sample(NAMES, d + 2))
        content = f"{key}: {p.value()}"
        files = {src: record(p, [content], long=rng.random() < 0.5)}
        for name in others:
            files[name] = record(p, [f"{key}: {p.value()}"])
        request = f"Copy the {key} line from {src} to a new file {target}. Then answer done."
        solution = [call("read_file", path=src), call("write_file", path=target, content=content),
                    call("submit", answer="done")]
    checker = {"type": "all", "checks": [{"type": "file_equals", "path": target, "value": content},
                                         {"type": "answer_equals", "value": "done"}]}
    return {"request": request,
            "files": sorted_files(files),
            "checker": checker,
            "solution": solution,
            "difficulty": {"distractors": d}}


def make_multihop(rng):
    """Start at the named file, follow "next: FILE" links for 2-3 hops, submit the asked key's value at the end.
    1-2 distractors: the first carries the asked key with another value (so a search for the key finds two files
    and the links must be followed); a second one carries a value or links to the first."""
    p, hops, d = Pools(rng), rng.randint(*MULTIHOP_HOPS), rng.randint(1, 2)
    names = files_of(rng.sample(NAMES, hops + 1 + d))
    chain, others = names[:hops + 1], names[hops + 1:]
    key = rng.choice(KEYS)
    value = p.value()
    files = {}
    for a, b in zip(chain, chain[1:]):  # the asked key stands only at the end of the chain
        files[a] = record(p, [f"next: {b}"], avoid=[key], short=rng.random() < 0.5)
    files[chain[-1]] = record(p, [f"{key}: {value}"], long=rng.random() < 0.5)
    files[others[0]] = record(p, [f"{key}: {p.value()}"])
    for name in others[1:]:
        line = f"next: {others[0]}" if rng.random() < 0.4 else f"{key}: {p.value()}"
        files[name] = record(p, [line])
    solution = [call("read_file", path=f) for f in chain] + [call("submit", answer=str(value))]
    return {"request": f"Start at {chain[0]} and follow the next links. Answer with the {key} you find.",
            "files": sorted_files(files),
            "checker": {"type": "answer_equals", "value": str(value)},
            "solution": solution,
            "difficulty": {"distractors": d, "hops": hops}}


def make_count(rng):
    """Which files have a line with the asked key? Search for "KEY:" (one hit a matching file), submit their names.
    4-6 of 6-9 files match; the others hold other keys only, and at least 2 do not match. The answer is a set of
    names (answer_set), not a small count: "How many files?" (2-5) was passed 8 times in 20 by the constant "4"."""
    p, m = Pools(rng), rng.randint(*COUNT_MATCHING)
    n = m + rng.randint(2, 3)
    names = files_of(rng.sample(NAMES, n))
    key = rng.choice(KEYS)
    files = {}
    for name in names[:m]:
        files[name] = record(p, [f"{key}: {p.value()}"], long=rng.random() < 0.3)
    for name in names[m:]:  # every file has key lines: only the asked key tells them apart
        other_keys = p.key_lines(rng.randint(1, 2), avoid=[key])
        files[name] = record(p, extra=other_keys, avoid=[key], long=rng.random() < 0.3)
    matching = sorted(names[:m])
    solution = [call("search", query=f"{key}:"), call("submit", answer=", ".join(matching))]
    return {"request": f"Which files have a {key} line? Answer with their names.",
            "files": sorted_files(files),
            "checker": {"type": "answer_set", "values": matching},
            "solution": solution,
            "difficulty": {"files": n, "matching": m}}


MAKERS = {"lookup": make_lookup, "sum": make_sum, "edit": make_edit, "multihop": make_multihop,
          "search": make_search, "count": make_count}


def content_key(task):
    """What makes two instances the same task (the id is not part of it)."""
    return json.dumps([task["family"], task["request"], task["files"], task["checker"]], sort_keys=True)


def make_split(rng, n, split, taken):
    """n tasks cycling through the families; skips any instance whose content is in `taken`."""
    tasks, counters = [], {f: 0 for f in FAMILIES}
    for i in range(n):
        family = FAMILIES[i % len(FAMILIES)]
        for _ in range(1000):
            task = {"family": family, **MAKERS[family](rng)}
            if content_key(task) not in taken:
                break
        else:
            raise SystemExit(f"error: could not make a new {family} task; lower --n-train/--n-test")
        taken.add(content_key(task))
        tasks.append({"task_id": f"{family}-{split}-{counters[family]:04d}", **task})
        counters[family] += 1
    return tasks


def write_jsonl(path, rows):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description="Generate the default workspace tasks (seeded).")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same tasks)")
    p.add_argument("--n-train", type=int, default=300, help="number of training tasks")
    p.add_argument("--n-test", type=int, default=120, help="number of test tasks")
    p.add_argument("--out-dir", default=str(Path(__file__).resolve().parent), help="output folder")
    args = p.parse_args()
    if args.n_train < 0 or args.n_test < 0:
        print("error: --n-train and --n-test must be >= 0", file=sys.stderr)
        sys.exit(2)
    taken = set()
    train = make_split(random.Random(args.seed), args.n_train, "train", taken)
    test = make_split(random.Random(args.seed + 1_000_003), args.n_test, "test", taken)
    os.makedirs(args.out_dir, exist_ok=True)
    write_jsonl(Path(args.out_dir) / "train_tasks.jsonl", train)
    write_jsonl(Path(args.out_dir) / "test_tasks.jsonl", test)
    for name, rows in (("train", train), ("test", test)):
        by_family = {f: sum(t["family"] == f for t in rows) for f in FAMILIES}
        print(f"{name}: {len(rows)} tasks  " + "  ".join(f"{f}={n}" for f, n in by_family.items()))
    print(f"wrote {args.out_dir}/train_tasks.jsonl and test_tasks.jsonl (seed {args.seed})")


if __name__ == "__main__":
    main()
