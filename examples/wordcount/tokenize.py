"""Split a text into lower-case words, one per line: `tokenize.py INPUT OUTPUT`."""

import re
import sys


def main(source: str, output: str) -> None:
    with open(source, encoding="utf-8") as f:
        words = re.findall(r"[a-z']+", f.read().lower())
    with open(output, "w", encoding="utf-8") as f:
        kept = [word.strip("'") for word in words if word.strip("'")]
        f.writelines(word + "\n" for word in kept)
    print(f"tokenize: {len(kept)} words in {source}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
