"""The report every GPU proof script writes: lines printed as they come and kept for a Markdown
file, checks counted as they fail, and bytes shown with their digits grouped."""
from pathlib import Path


def g(n):
    """Bytes with digits grouped by three."""
    return f"{int(n):,}".replace(",", " ")


class Report:
    def __init__(self):
        self.lines = []
        self.failures = 0

    def say(self, s=""):
        """Prints a line and keeps it for the file."""
        self.lines.append(s)
        print(s, flush=True)

    def check(self, ok, what):
        """Says whether `what` holds, counts it when it does not, and returns `ok`."""
        self.failures += not ok
        self.say(f"- {what}: {'OK' if ok else '**FAILED**'}")
        return ok

    def write(self, path: Path):
        """Writes every line said to `path`."""
        path.write_text("\n".join(self.lines) + "\n")
