#!/usr/bin/env python3
"""Renders the output of a notebook program (scripts/notebook-program.py) as Markdown: each cell's
HTML tables become Markdown tables, paragraphs become text, SVG charts are counted, not embedded,
each part in the order the cell shows it.

    python3 scripts/gpu/render-cells.py PROGRAM_OUTPUT > OUTPUT.md
"""
import html
import re
import sys


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def main() -> int:
    raw = open(sys.argv[1]).read()
    for n, body in re.findall(r"=== cell (\d+)\n(.*?)(?==== cell |\Z)", raw, re.S):
        print(f"### Cell {n}\n")
        for mime, content in re.findall(r"EVCXR_BEGIN_CONTENT (\S+)\n(.*?)\nEVCXR_END_CONTENT", body, re.S):
            # One output may hold several parts (a measured table, then the predicted one; a map
            # and its prediction): each table, chart and paragraph in its order.
            parts = re.findall(r"(<table.*?</table>|<svg.*?</svg>|<p>.*?</p>)", content, re.S)
            for part in parts:
                if part.startswith("<svg"):
                    print("(SVG chart, %d bytes)\n" % len(part))
                elif part.startswith("<p>"):
                    print(text(part) + "\n")
                else:
                    caption = re.search(r"<caption[^>]*>(.*?)</caption>", part, re.S)
                    if caption:
                        print(f"**{text(caption.group(1))}**\n")
                    rows = re.findall(r"<tr>(.*?)</tr>", part, re.S)
                    for i, r in enumerate(rows):
                        cells = [text(c).replace("|", "\\|") for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
                        print("| " + " | ".join(cells) + " |")
                        if i == 0:
                            print("|" + " --- |" * len(cells))
                    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
