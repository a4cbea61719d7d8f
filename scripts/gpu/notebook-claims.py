#!/usr/bin/env python3
"""Checks the figures that `notebooks/mesure-memoire.ipynb` printed against the sentences it
states, from the output of its program (scripts/notebook-program.py), run on a GPU:

    python3 scripts/gpu/notebook-claims.py PROGRAM_OUTPUT

- the seed's two measurements are shown, the second being the seed's second command exactly
  (batch 2, context 128, width 1024, float32, warm-up 3, repeats 5);
- each measurement ran in a fresh process: its `cold_forward` is a real first pass, so its
  allocated end grows by at least cuBLAS's workspace (32 MiB on the H200's architecture) beyond the
  pass's output, while the warm passes end where the cold one did;
- the measured and predicted table has every residual at 0.
Prints one line per claim and exits 1 if any is contradicted. (The lesson's claims are checked by
scripts/gpu/lesson-proof.py.)
"""
import re
import sys

WORKSPACE = 32 << 20


def tables(raw):
    out = []
    for body in re.findall(r"<table>(.*?)</table>", raw, re.S):
        caption = re.sub(r"<[^>]+>", "", (re.findall(r"<caption.*?</caption>", body, re.S) or [""])[0])
        rows = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
                for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
        out.append((caption.strip(), [r for r in rows if r]))
    return out


def main() -> int:
    raw = open(sys.argv[1]).read()
    all_tables = tables(raw)
    measured = [(c, rows) for c, rows in all_tables if " — [batch " in c]
    failed = 0

    def claim(ok, text):
        nonlocal failed
        failed += not ok
        print(f"{'OK  ' if ok else 'FAIL'} {text}")

    claim(len(measured) == 2, f"the two measurements of the seed are shown ({len(measured)} found)")
    if len(measured) == 2:
        second_caption, second = measured[1]
        warm = [r for r in second if r[0] == "warm_forward"]
        warmup = [r for r in second if r[0] == "warmup"]
        claim("[batch 2, context 128, width 1024]" in second_caption and "float32" in second_caption
              and len(warm) == 5 and len(warmup) == 1,
              "the second is the seed's second command: batch 2, context 128, width 1024, float32, "
              f"warm-up in one row, 5 repeats ({second_caption}; {len(warm)} warm rows)")
    for caption, rows in measured:
        cold = next((r for r in rows if r[0] == "cold_forward"), None)
        warm_ends = {r[3] for r in rows if r[0] == "warm_forward"}
        if cold is None:
            claim(False, f"{caption}: a cold_forward row")
            continue
        base, end = int(cold[2]), int(cold[3])
        claim(end - base >= WORKSPACE,
              f"{caption}: cold_forward is a first pass of its own process (allocated +{end - base} B, "
              f"at least the {WORKSPACE} B workspace)")
        claim(warm_ends == {cold[3]}, f"{caption}: every warm pass ends where the cold one did ({sorted(warm_ends)})")
    predicted = [(c, rows) for c, rows in all_tables if c.startswith("Measured and predicted")]
    claim(len(predicted) == 1, "the measured and predicted table is shown")
    for caption, rows in predicted:
        residuals = [r for r in rows if len(r) > 1 and r[1] == "residual"]
        claim(bool(residuals) and all(all(x == "0" for x in r[2:]) for r in residuals),
              f"every residual is 0 ({len(residuals)} rows)")
    print(f"contradicted claims: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
