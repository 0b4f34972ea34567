"""Write the final report: `report.py TOP TOTAL OUTPUT`."""

import sys


def main(top: str, total: str, output: str) -> None:
    with open(total, encoding="utf-8") as f:
        words = int(f.read().split()[0])
    with open(top, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    with open(output, "w", encoding="utf-8") as f:
        f.write(f"{words} words; the {len(rows)} most frequent:\n")
        for count, word in rows:
            f.write(f"{word:<12} {count:>5}  {100 * int(count) / words:5.1f}%\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
