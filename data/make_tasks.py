"""make_tasks.py: the seeded generator of the default workspace tasks (train and test sets).

    python data/make_tasks.py                       # writes data/train_tasks.jsonl and data/test_tasks.jsonl
    python data/make_tasks.py --seed 1 --n-train 600 --n-test 200 --out-dir /tmp/tasks

Same seed, same files (the committed sets are made with the defaults). The generator only
writes data; the environment that runs and scores the tasks lives in 04_rollout.py.

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
    file_equals   {path, value}  the file's final text equals value (surrounding whitespace ignored)
    file_contains {path, value}  the file's final text contains value
    all           {checks: [...]} passes when every sub-check passes (04 keeps each one's 0/1 in `checks`)
Canonical tools for `solution`: list_files(), read_file(path), search(query),
write_file(path, content), calculator(expression), submit(answer).

Families (all entities come from small fixed pools so a small BPE makes them single tokens):
    lookup    read one file among distractors and submit a value; half the tasks name the file by an
              animal it mentions, so the solution first searches for the animal, then reads the file
    sum       read 2-3 files, add the values with the calculator, submit the sum
    edit      set a value in a multi-line file (read it, write it back with one line changed), or copy
              a line to a new file; then answer "done"
    multihop  follow "next: FILE" links for 1-3 hops, submit the value at the end
    search    find which file mentions an animal (search tool), submit the file name
    count     list the files, submit how many there are
Files are records of 1-11 short lines: "key: value" lines (every number of a task is distinct, and
numbers appear only there), at most one "seen: the ANIMAL by the NAME" line (an animal is mentioned in
one file only), and "tags: NAME NAME ..." filler lines. About half of the files an oracle solution
reads are long (over 300 characters), so a harness that cuts outputs at 300 characters hides their
tail, and line numbers, windows and elision change what a policy sees. The line a solution needs
always ends within the first NEEDED_WITHIN = 250 characters of its file, so it survives every cut in
the harness space (300) and the out-of-space harnesses (500-1000, line numbers included): every task
stays solvable under every harness. Edited files are short (<= 250 characters), so the whole file
that must be written back is visible.
Difficulty: the number of distractor files (0-3) and the hop count / number of terms.
Train and test sets are disjoint: no test task has the same family, request, files and
checker as a train task (content is compared, not ids).
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
NEEDED_WITHIN = 250  # the line a solution needs ends within this many characters of its file


def call(tool, **args):
    return {"tool": tool, "args": args}


def files_of(names):
    return [n + ".txt" for n in names]


class Pools:
    """Draws without replacement within one task: every number, key set and animal is distinct."""

    def __init__(self, rng):
        self.rng = rng
        self.values = rng.sample(VALUES, len(VALUES))
        self.animals = rng.sample(ANIMALS, len(ANIMALS))

    def value(self):
        return self.values.pop()

    def animal(self):
        return self.animals.pop()

    def key_lines(self, n, avoid=()):
        return [f"{k}: {self.value()}" for k in self.rng.sample([k for k in KEYS if k not in avoid], n)]

    def tags(self):
        return "tags: " + " ".join(self.rng.sample(NAMES, self.rng.randint(4, 6)))


def record(pools, needed=(), extra=(), avoid=(), long=False, seen=False, short=False):
    """A file's text: the `needed` lines (each ending within NEEDED_WITHIN characters), the `extra` lines,
    0-2 other key lines (no key of `avoid` or of the lines above), an optional 'seen:' line, and tags
    lines: 0-1 (none when short), or as many as make the file longer than LONG characters (long)."""
    rng = pools.rng
    used = {line.split(":")[0] for line in list(needed) + list(extra)} | set(avoid)
    lines = list(extra) + pools.key_lines(rng.randint(0, 2), avoid=used)
    if seen:
        lines.append(f"seen: the {pools.animal()} by the {rng.choice(NAMES)}")
    if not short:
        lines += [pools.tags() for _ in range(rng.randint(0, 1))]
    rng.shuffle(lines)
    for line in needed:  # at a random place that keeps it within the first NEEDED_WITHIN characters
        fits = [i for i in range(len(lines) + 1) if sum(len(x) + 1 for x in lines[:i]) + len(line) <= NEEDED_WITHIN]
        lines.insert(rng.choice(fits), line)
    while not lines or (long and len("\n".join(lines)) <= LONG):
        lines.append(pools.tags())
    return "\n".join(lines)


def make_lookup(rng):
    p, d = Pools(rng), rng.randint(1, 3)
    target, *others = files_of(rng.sample(NAMES, d + 1))
    key, by_animal = rng.choice(KEYS), rng.random() < 0.5
    value = p.value()
    # by_animal: the request names the file by the animal it mentions (search first, then read)
    files = {target: record(p, [f"{key}: {value}"], long=rng.random() < 0.5, seen=by_animal)}
    animal = files[target].split("seen: the ")[1].split()[0] if by_animal else None
    for name in others:  # distractors: the same key with another value
        files[name] = record(p, [f"{key}: {p.value()}"], long=rng.random() < 0.3, seen=by_animal)
    files = {k: files[k] for k in sorted(files)}  # the target is not always the first file listed
    answer = str(value)
    if by_animal:
        request = f"One file mentions the {animal}. What is the {key} in it? Answer with the number."
        solution = [call("search", query=animal), call("read_file", path=target), call("submit", answer=answer)]
    else:
        request = f"What is the {key} in {target}? Answer with the number."
        solution = [call("read_file", path=target), call("submit", answer=answer)]
    return {"request": request, "files": files, "checker": {"type": "answer_equals", "value": answer},
            "solution": solution, "difficulty": {"distractors": d, "search_first": by_animal}}


def make_sum(rng):
    p, n, d = Pools(rng), rng.randint(2, 3), rng.randint(0, 2)
    names = files_of(rng.sample(NAMES, n + d))
    key = rng.choice(KEYS)
    terms = [p.value() for _ in range(n)]
    long = rng.randrange(2 * n)  # about half of the tasks have one long term file
    files = {name: record(p, [f"{key}: {v}"], long=i == long) for i, (name, v) in enumerate(zip(names, terms))}
    for name in names[n:]:
        files[name] = record(p, [f"{key}: {p.value()}"])
    total = str(sum(terms))
    listed = ", ".join(names[:n - 1]) + " and " + names[n - 1]
    solution = [call("read_file", path=f) for f in names[:n]]
    solution += [call("calculator", expression="+".join(map(str, terms))), call("submit", answer=total)]
    return {"request": f"Add the {key} in {listed}. Answer with the sum.", "files": files,
            "checker": {"type": "answer_equals", "value": total}, "solution": solution,
            "difficulty": {"distractors": d, "terms": n}}


def make_edit(rng):
    p, d = Pools(rng), rng.randint(0, 2)
    key = rng.choice(KEYS)
    if rng.random() < 0.5:  # set a value in place: read the file, write it back with one line changed
        target, *others = files_of(rng.sample(NAMES, d + 1))
        old, new = p.value(), p.value()
        text = record(p, [f"{key}: {old}"], extra=p.key_lines(rng.randint(1, 2), avoid=[key]), short=True)
        content = text.replace(f"{key}: {old}", f"{key}: {new}")
        files = {target: text, **{o: record(p, [f"{key}: {p.value()}"]) for o in others}}
        request = f"Set the {key} in {target} to {new}, keep the other lines. Then answer done."
        solution = [call("read_file", path=target), call("write_file", path=target, content=content),
                    call("submit", answer="done")]
    else:  # copy a line to a new file
        src, target, *others = files_of(rng.sample(NAMES, d + 2))
        content = f"{key}: {p.value()}"
        files = {src: record(p, [content], long=rng.random() < 0.5),
                 **{o: record(p, [f"{key}: {p.value()}"]) for o in others}}
        request = f"Copy the {key} line from {src} to a new file {target}. Then answer done."
        solution = [call("read_file", path=src), call("write_file", path=target, content=content),
                    call("submit", answer="done")]
    checker = {"type": "all", "checks": [{"type": "file_equals", "path": target, "value": content},
                                         {"type": "answer_equals", "value": "done"}]}
    return {"request": request, "files": files, "checker": checker, "solution": solution,
            "difficulty": {"distractors": d}}


def make_multihop(rng):
    p, hops, d = Pools(rng), rng.randint(1, 3), rng.randint(0, 2)
    names = files_of(rng.sample(NAMES, hops + 1 + d))
    chain, others = names[:hops + 1], names[hops + 1:]
    key = rng.choice(KEYS)
    value = p.value()
    # the asked key stands only at the end of the chain
    files = {a: record(p, [f"next: {b}"], avoid=[key], short=rng.random() < 0.5) for a, b in zip(chain, chain[1:])}
    files[chain[-1]] = record(p, [f"{key}: {value}"], long=rng.random() < 0.5)
    for o in others:  # distractors: values, or links to a wrong file
        link = [x for x in others if x != o]
        files[o] = record(p, [f"next: {rng.choice(link)}"] if link and rng.random() < 0.4 else [f"{key}: {p.value()}"])
    solution = [call("read_file", path=f) for f in chain] + [call("submit", answer=str(value))]
    return {"request": f"Start at {chain[0]} and follow the next links. Answer with the {key} you find.",
            "files": files, "checker": {"type": "answer_equals", "value": str(value)},
            "solution": solution, "difficulty": {"distractors": d, "hops": hops}}


def make_search(rng):
    p, d = Pools(rng), rng.randint(1, 3)
    names = files_of(rng.sample(NAMES, d + 1))
    files = {name: record(p, seen=True, long=rng.random() < 0.3) for name in names}
    target = names[0]
    animal = files[target].split("seen: the ")[1].split()[0]
    return {"request": f"Which file mentions the {animal}? Answer with the file name.",
            "files": {k: files[k] for k in sorted(files)},  # the target is not always the first file listed
            "checker": {"type": "answer_equals", "value": target},
            "solution": [call("search", query=animal), call("submit", answer=target)],
            "difficulty": {"distractors": d}}


def make_count(rng):
    p, n = Pools(rng), rng.randint(2, 5)
    files = {name: record(p) for name in files_of(rng.sample(NAMES, n))}
    return {"request": "How many files are in the workspace? Answer with the number.", "files": files,
            "checker": {"type": "answer_equals", "value": str(n)},
            "solution": [call("list_files"), call("submit", answer=str(n))],
            "difficulty": {"files": n}}


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
