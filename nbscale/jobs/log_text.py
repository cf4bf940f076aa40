"""A job's log as a terminal shows it, read with memory bounded by what is shown, not by the file.

A progress bar (tqdm, `print('\\r...', end='')`) redraws one line in place with carriage returns: its log can be
hundreds of megabytes without a newline. The terminal shows, of each line, only what follows its last `\\r`;
these readers keep only that, reading the whole file in chunks (`shown_text`) or a bounded window at its end
(`shown_tail`).
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

CHUNK_BYTES = 1 << 20
TAIL_WINDOW_BYTES = 4 << 20  # shown_tail reads at most this much (or 4 bytes a character asked for, if more)


def terminal_text(text: str) -> str:
    """`text` as a terminal leaves it on screen: of each line only what follows its last carriage return (a
    progress line redrawn in place with '\\r'); a '\\r' ending a line, as in '\\r\\n', redraws nothing."""
    return "\n".join(_shown(line) for line in text.split("\n"))


def _shown(line: str) -> str:
    drawn = line.rstrip("\r")
    return drawn[drawn.rfind("\r") + 1 :]


def _redrawn(line: str) -> str:
    """An unfinished line without what a later '\\r' already wiped (a '\\r' at its very end may be a '\\r\\n')."""
    cut = line.rstrip("\r").rfind("\r")
    return line[cut + 1 :] if cut >= 0 else line


def shown_text(path: Path) -> str:
    """The whole log as shown, read in chunks: a line redrawn a million times costs the memory of its last draw."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    lines: list[str] = []
    line = ""
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            *ended, line_rest = decoder.decode(chunk).split("\n")
            for piece in ended:
                lines.append(_shown(line + piece))
                line = ""
            line = _redrawn(line + line_rest)
    lines.append(_shown(line + decoder.decode(b"", final=True)))
    return "\n".join(lines)


def shown_tail(path: Path, tail: int) -> str:
    """The last `tail` characters of the log as shown, read from at most max(4 * tail + 1, TAIL_WINDOW_BYTES)
    bytes at the end of the file: fewer when the end of the file holds less shown text than that (a bar redrawn
    over megabytes shows only its last draw)."""
    if tail == 0:
        return ""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        wanted = 4 * tail + 1  # 4 bytes hold any character; redraws make the shown text shorter still
        if wanted >= size:  # the whole file: read in chunks, so its redraws are never all in memory at once
            return shown_text(path)[-tail:]
        limit = max(wanted, TAIL_WINDOW_BYTES)
        while True:
            start = max(0, size - wanted)
            file.seek(start)
            text = _window_text(file.read(size - start), cut=start > 0)
            if len(text) >= tail or not start or wanted >= limit:
                return text[-tail:]
            wanted = min(wanted * 4, limit)


def _window_text(raw: bytes, cut: bool) -> str:
    """The shown text of the file's last bytes `raw`: a suffix of the whole file's. Its first line, cut by the
    window, is shown from its last '\\r' if the window holds one (exactly as in the file), else as it ends."""
    if cut:  # the window may start inside a character: skip its continuation bytes
        skip = 0
        while skip < min(3, len(raw)) and raw[skip] & 0xC0 == 0x80:
            skip += 1
        raw = raw[skip:]
    return terminal_text(raw.decode("utf-8", errors="replace"))
