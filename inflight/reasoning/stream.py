"""Splitting one generation into thinking and answer, as it streams.

`ReasoningStreamer.feed(delta)` returns (reasoning delta, content delta). Every decision depends
only on text already seen, never on where the pieces were cut, so the streamed deltas add up to
what one `feed(whole) + finish()` returns, and a tag split across chunks never leaks into either
part (a possible tag prefix is held back until the next chunk decides it).

    start --(whitespace, then the start tag)--> reasoning --(end tag)--> content
      `--(anything else: no thinking in this output)--> content

`start` is where a generation begins when its prompt did not open a thinking section; one that
begins in `reasoning` (the prompt ended with the start tag, or DeepSeek-R1's rule) may still
repeat the start tag first, which is dropped. Whitespace right after either tag is dropped
(Qwen3 writes "<think>\\n...\\n</think>\\n\\n"); a later start tag in the answer is answer text.
"""

from __future__ import annotations


def partial_suffix(text: str, literal: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `literal`."""
    for k in range(min(len(literal) - 1, len(text)), 0, -1):
        if text.endswith(literal[:k]):
            return k
    return 0


class ReasoningStreamer:
    """One generation's splitter; `start` / `end` are the thinking tags."""

    def __init__(self, start: str, end: str, in_reasoning: bool) -> None:
        self.start, self.end = start, end
        self.state = "reasoning" if in_reasoning else "start"
        self.lead = True  # at the head of the current part: leading whitespace / a repeated tag go
        self.saw_reasoning = in_reasoning
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        return self._run(eof=False)

    def finish(self) -> tuple[str, str]:
        """What was held back, once the generation ended (a partial tag is text after all)."""
        return self._run(eof=True)

    def _run(self, eof: bool) -> tuple[str, str]:
        reasoning, content = [], []
        while self.buf:
            if self.state == "start":
                if not self._st_start(eof, content):
                    break
            elif self.state == "reasoning":
                if not self._st_reasoning(eof, reasoning):
                    break
            else:
                if self.lead:
                    self.buf = self.buf.lstrip()
                    if not self.buf:
                        break
                    self.lead = False
                content.append(self.buf)
                self.buf = ""
        return "".join(reasoning), "".join(content)

    def _st_start(self, eof: bool, content: list[str]) -> bool:
        head = self.buf.lstrip()
        if head.startswith(self.start):
            self.buf = head[len(self.start) :]
            self.state, self.lead, self.saw_reasoning = "reasoning", True, True
            return True
        if not eof and self.start.startswith(head):  # whitespace or a tag prefix: wait
            return False
        self.state, self.lead = "content", False  # no thinking: everything is answer, verbatim
        content.append(self.buf)
        self.buf = ""
        return True

    def _st_reasoning(self, eof: bool, reasoning: list[str]) -> bool:
        if self.lead:
            head = self.buf.lstrip()
            if head.startswith(self.start):  # DeepSeek-R1 may repeat the tag its prompt opened
                head = head[len(self.start) :].lstrip()
            elif not eof and (not head or self.start.startswith(head)):
                return False
            self.buf = head
            if not head:
                return False
            self.lead = False
        at = self.buf.find(self.end)
        if at >= 0:
            reasoning.append(self.buf[:at])
            self.buf = self.buf[at + len(self.end) :]
            self.state, self.lead = "content", True
            return True
        keep = 0 if eof else partial_suffix(self.buf, self.end)
        reasoning.append(self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep :]
        return False
