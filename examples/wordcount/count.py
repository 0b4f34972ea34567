"""Count words, one per line: `count.py WORDS OUTPUT` writes `N<TAB>word`, most frequent first."""

import collections
import sys


def main(source: str, output: str) -> None:
    with open(source, encoding="utf-8") as f:
        counts = collections.Counter(line.strip() for line in f if line.strip())
    with open(output, "w", encoding="utf-8") as f:
        for word, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            f.write(f"{n}\t{word}\n")
    print(f"count: {len(counts)} distinct words, {sum(counts.values())} in all")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
