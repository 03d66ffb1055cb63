"""make_tasks.py: the seeded generator of the default workspace tasks (train and test sets).

    python data/make_tasks.py                       # writes data/train_tasks.jsonl and data/test_tasks.jsonl
    python data/make_tasks.py --seed 1 --n-train 600 --n-test 200 --out-dir /tmp/tasks

Same seed, same files (the committed sets are made with the defaults). The generator only
writes data; the environment that runs and scores the tasks lives in 04_rollout.py.

Task schema (one JSON object per line; bring your own tasks in the same shape):

    {"task_id": "lookup-train-0007",          unique id (string)
     "family": "lookup",                      free-form label used in summaries
     "request": "What is the code in river.txt? Submit the number.",   the first user message
     "files": {"river.txt": "code: 417", "stone.txt": "code: 58"},    the workspace {path: text}
     "checker": {"type": "answer_equals", "value": "417"},           how the episode is scored
     "solution": [{"tool": "read_file", "args": {"path": "river.txt"}},   optional: canonical calls
                  {"tool": "submit", "args": {"answer": "417"}}],         the oracle replays
     "difficulty": {"distractors": 1}}        optional, informational

checker types (score in [0, 1]; success = score 1):
    answer_equals {value}        the submitted answer equals value (trimmed, case-folded,
                                 whitespace collapsed, a trailing '.' dropped; numbers compared as numbers)
    file_equals   {path, value}  the file's final text equals value (surrounding whitespace ignored)
    file_contains {path, value}  the file's final text contains value
    all           {checks: [...]} fraction of the sub-checks that pass
Canonical tools for `solution`: list_files(), read_file(path), search(query),
write_file(path, content), calculator(expression), submit(answer).

Families (all entities come from small fixed pools so a small BPE makes them single tokens):
    lookup    read one file among distractors, submit a value
    sum       read 2-3 files, add the values with the calculator, submit the sum
    edit      set a value in a file, or copy a line to a new file; then submit "done"
    multihop  follow "next: FILE" links for 1-2 hops, submit the value at the end
    search    find which file mentions an animal (search tool), submit the file name
    count     list the files, submit how many there are
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


def call(tool, **args):
    return {"tool": tool, "args": args}


def files_of(names):
    return [n + ".txt" for n in names]


def make_lookup(rng):
    d = rng.randint(1, 3)
    target, *others = files_of(rng.sample(NAMES, d + 1))
    key = rng.choice(KEYS)
    vals = rng.sample(VALUES, d + 1)
    files = {target: f"{key}: {vals[0]}"}
    if rng.random() < 0.5:  # a second line with another key in the target file
        files[target] += f"\n{rng.choice([k for k in KEYS if k != key])}: {rng.choice(VALUES)}"
    for name, v in zip(others, vals[1:]):
        files[name] = f"{key}: {v}"
    return {"request": f"What is the {key} in {target}? Submit the number.", "files": files,
            "checker": {"type": "answer_equals", "value": str(vals[0])},
            "solution": [call("read_file", path=target), call("submit", answer=str(vals[0]))],
            "difficulty": {"distractors": d}}


def make_sum(rng):
    n, d = rng.randint(2, 3), rng.randint(0, 2)
    names = files_of(rng.sample(NAMES, n + d))
    key = rng.choice(KEYS)
    vals = rng.sample(VALUES, n + d)
    files = {name: f"{key}: {v}" for name, v in zip(names, vals)}
    terms, total = vals[:n], str(sum(vals[:n]))
    listed = ", ".join(names[:n - 1]) + " and " + names[n - 1]
    solution = [call("read_file", path=p) for p in names[:n]]
    solution += [call("calculator", expression="+".join(map(str, terms))), call("submit", answer=total)]
    return {"request": f"Add the {key} in {listed}. Submit the sum.", "files": files,
            "checker": {"type": "answer_equals", "value": total}, "solution": solution,
            "difficulty": {"distractors": d, "terms": n}}


def make_edit(rng):
    d = rng.randint(0, 2)
    key = rng.choice(KEYS)
    if rng.random() < 0.5:  # set a value in place
        target, *others = files_of(rng.sample(NAMES, d + 1))
        old, new, *rest = rng.sample(VALUES, d + 2)
        files = {target: f"{key}: {old}", **{o: f"{key}: {v}" for o, v in zip(others, rest)}}
        line = f"{key}: {new}"
        request = f"Set the {key} in {target} to {new}. Then submit done."
        solution = [call("write_file", path=target, content=line), call("submit", answer="done")]
    else:  # copy a line to a new file
        src, dst, *others = files_of(rng.sample(NAMES, d + 2))
        val, *rest = rng.sample(VALUES, d + 1)
        line = f"{key}: {val}"
        files = {src: line, **{o: f"{key}: {v}" for o, v in zip(others, rest)}}
        target = dst
        request = f"Copy the {key} line from {src} to a new file {dst}. Then submit done."
        solution = [call("read_file", path=src), call("write_file", path=dst, content=line),
                    call("submit", answer="done")]
    checker = {"type": "all", "checks": [{"type": "file_equals", "path": target, "value": line},
                                         {"type": "answer_equals", "value": "done"}]}
    return {"request": request, "files": files, "checker": checker, "solution": solution,
            "difficulty": {"distractors": d}}


def make_multihop(rng):
    hops, d = rng.randint(1, 2), rng.randint(0, 2)
    names = files_of(rng.sample(NAMES, hops + 1 + d))
    chain, others = names[:hops + 1], names[hops + 1:]
    key = rng.choice(KEYS)
    val, *rest = rng.sample(VALUES, 1 + d)
    files = {a: f"next: {b}" for a, b in zip(chain, chain[1:])}
    files[chain[-1]] = f"{key}: {val}"
    for o, v in zip(others, rest):  # distractors: values, or links to a wrong file
        link = [x for x in others if x != o]
        files[o] = f"next: {rng.choice(link)}" if link and rng.random() < 0.4 else f"{key}: {v}"
    solution = [call("read_file", path=p) for p in chain] + [call("submit", answer=str(val))]
    return {"request": f"Start at {chain[0]} and follow the next links. Submit the {key} you find.",
            "files": files, "checker": {"type": "answer_equals", "value": str(val)},
            "solution": solution, "difficulty": {"distractors": d, "hops": hops}}


def make_search(rng):
    d = rng.randint(1, 3)
    names = files_of(rng.sample(NAMES, d + 1))
    animals = rng.sample(ANIMALS, d + 1)
    files = {name: f"we saw the {a}" for name, a in zip(names, animals)}
    order = sorted(files)  # the target is not always the first file listed
    target = names[0]
    return {"request": f"Which file mentions the {animals[0]}? Submit the file name.",
            "files": {k: files[k] for k in order},
            "checker": {"type": "answer_equals", "value": target},
            "solution": [call("search", query=animals[0]), call("submit", answer=target)],
            "difficulty": {"distractors": d}}


def make_count(rng):
    n = rng.randint(2, 5)
    names = files_of(rng.sample(NAMES, n))
    files = {name: f"{rng.choice(KEYS)}: {rng.choice(VALUES)}" for name in names}
    return {"request": "How many files are in the workspace? Submit the number.", "files": files,
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
