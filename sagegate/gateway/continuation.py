"""A paused request's text so far, the continuation that resumes it, and the resumed stream made to
look like the one the client started reading (no I/O here; ``gateway.resume`` drives it).

The client must see one answer: every chunk with the first try's ``id``, ``created`` and ``model``;
a resumed try's opening chat chunk (the role, again) dropped; one final usage with the original
prompt and every token generated. The continuation is what vLLM continues from: a completion prompt
with the text appended, or the chat with the partial assistant message and
``continue_final_message: true, add_generation_prompt: false``; its ``max_tokens`` (or
``max_completion_tokens``, ``min_tokens``) less what was generated. Anything else in the body
(including fields the gateway never reads) goes on as the client sent it.
"""

from __future__ import annotations

import json
from typing import Any

from sagegate.core import sse
from sagegate.gateway.openai_schema import Route

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) ``max_tokens`` of a completion that sends none: a continuation states it."""
UNREAD_BYTES = 64 * 1024
"""The first try's events are kept as sent (read only if it is paused) up to this much, then read."""
_CAPS = ("max_tokens", "max_completion_tokens")
_FINISHED, _FINISHED_SPACED = b'"finish_reason":"', b'"finish_reason": "'


_CONSTRAINED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
"""vLLM's constrained-decoding fields: a continuation would restart the grammar at its start."""


def unresumable(route: str, body: dict[str, Any]) -> str | None:
    """Why a request cannot be continued from its text faithfully (None: it can). The continuation
    carries text only, so a resumed answer must be one a single backend could have sent: one choice;
    a completion of one text prompt without ``echo`` (token ids and echoed prompts cannot be
    extended by text); no tools (a tool call in progress is held back by the engine's parser, not
    sent as text), no logprobs or token ids (the resumed prompt is tokenized anew), no constrained
    output (its grammar would start again)."""
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return "several choices (n > 1)"
    if body.get("tools") and body.get("tool_choice") != "none":
        return "tools"
    logprobs = body.get("logprobs")
    if (
        (logprobs is not None and logprobs is not False)
        or body.get("top_logprobs")
        or body.get("prompt_logprobs")
    ):
        return "logprobs"
    if body.get("return_token_ids") or body.get("return_tokens_as_token_ids"):
        return "token ids"
    fmt = body.get("response_format")
    if (isinstance(fmt, dict) and fmt.get("type") not in (None, "text")) or any(
        body.get(k) for k in _CONSTRAINED
    ):
        return "constrained output"
    if route == Route.CHAT:
        return None if isinstance(body.get("messages"), list) and body["messages"] else "no messages"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return "a token-id prompt"
    return "echo" if body.get("echo") else None


def pausable(route: str, body: dict[str, Any]) -> bool:
    """Whether a request can be continued from its text (:func:`unresumable` says why not)."""
    return unresumable(route, body) is None


def _events(block: bytes) -> list[bytes]:
    return sse.events(sse.normalize(block))


def _payload(event: bytes) -> Any:
    """An event's data as JSON; None without data, at ``[DONE]``, or when it does not parse."""
    raw = sse.data(event)
    if raw is None or raw == sse.DONE:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


class Transcript:
    """What the client has been sent of one request, across its tries (legs)."""

    def __init__(self, route: str, body: dict[str, Any]) -> None:
        self.chat = route == Route.CHAT
        self.route = route
        self.body = body
        """The client's body as sent: every continuation is built from it."""
        self.ident: dict[str, Any] | None = None
        """``id``, ``created``, ``model`` of the first try's first chunk: every chunk carries them."""
        self.text = ""
        self.tokens = 0
        """Tokens generated for the text sent: the backends' own running counts where they send
        them (:meth:`counted`), else one per token chunk."""
        self.leg_start = 0
        """:attr:`tokens` when the current try started."""
        self.leg = 0
        """Tries so far less one: 0 until the first resume."""
        self.prompt_offset = 0
        """Prompt tokens the current try's prompt holds beyond the client's (its text so far)."""
        self.prompt_tokens: int | None = None
        """The client's prompt in tokens as a backend counts it (set at a resume), for the usage."""
        self.finished = False
        """A chunk with a ``finish_reason`` has gone by: too late to pause."""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        """The final usage as the client sees it (the original prompt, every token)."""
        self.uncarried: str | None = None
        """What the client was sent that a continuation cannot carry (reasoning, a tool call,
        logprobs): None while the text is all of it."""
        self._unread: list[bytes] = []
        self._unread_bytes = 0

    @property
    def unread_bytes(self) -> int:
        """Bytes of the first try's events kept unread (at most about :data:`UNREAD_BYTES`)."""
        return self._unread_bytes

    # --- the stream -----------------------------------------------------------------------------
    def relay(self, data: bytes) -> bytes:
        """Whole events on their way to the client: the first try's pass as they are (read only if
        it is paused); a resumed try's are rewritten to continue the first."""
        if not data:
            return data
        if _FINISHED in data or _FINISHED_SPACED in data:  # (no generator: this runs per token)
            self.finished = True
        if self.leg == 0:
            self._unread.append(data)
            self._unread_bytes += len(data)
            if self._unread_bytes > UNREAD_BYTES:
                self.read()  # a long stream: fold it into its text (SSE is ~10× the text)
            return data
        out: list[bytes] = []
        for event in _events(data):
            obj = _payload(event)
            if not isinstance(obj, dict) or "error" in obj:
                out.append(event + b"\n\n")
                continue
            if self._rewrite(obj):
                out.append(sse.json_event(obj))
        return b"".join(out)

    def carried(self) -> bool:
        """Whether everything the client has been sent can be carried to another try (reads the
        first try's events so far): when not, the request must not be resumed (:attr:`uncarried`)."""
        self.read()
        return self.uncarried is None

    def read(self) -> None:
        """Take in the first try's events sent so far (at a pause: its text and token count)."""
        for data in self._unread:
            for event in _events(data):
                obj = _payload(event)
                if isinstance(obj, dict) and "error" not in obj:
                    self._take(obj)
        self._unread.clear()
        self._unread_bytes = 0

    def counted(self, leg_tokens: int) -> None:
        """The current try's backend says it generated ``leg_tokens`` for the text relayed so far
        (its running usage): more than its chunks when it held a token back until its text was whole."""
        self.tokens = self.leg_start + leg_tokens

    def _take(self, obj: dict[str, Any]) -> bool:
        """Count a chunk's token and text; False for a chunk that carries neither (a chat role)."""
        if self.ident is None and "id" in obj:
            self.ident = {k: obj.get(k) for k in ("id", "created", "model")}
        choices = obj.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return True
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if choice.get("logprobs"):
            self.uncarried = self.uncarried or "logprobs"
        if self.chat:
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                self.uncarried = self.uncarried or "a tool call"
            if delta.get("reasoning_content") or delta.get("reasoning"):
                self.uncarried = self.uncarried or "reasoning"
            piece = delta.get("content")
            if not piece and not delta.get("tool_calls") and choice.get("finish_reason") is None:
                return "role" not in delta  # the opening role chunk
        else:
            piece = choice.get("text")
        if isinstance(piece, str):
            self.text += piece
        self.tokens += 1
        return True

    def _rewrite(self, obj: dict[str, Any]) -> bool:
        """A resumed try's chunk as the first try's stream would have had it; False: drop it."""
        keep = self._take(obj)
        if not keep and self.leg > 0:
            return False
        if self.ident is not None:
            obj.update(self.ident)
        choices = obj.get("choices") or []
        if self.chat and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            obj["usage"] = self._usage(usage)
        return True

    def _usage(self, leg: dict[str, Any]) -> dict[str, Any]:
        """A resumed try's usage as the whole answer's: the client's prompt, every token generated."""
        prompt = leg.get("prompt_tokens")
        if self.prompt_tokens is not None:
            prompt = self.prompt_tokens
        elif isinstance(prompt, int):  # the backend's count less the gateway's of what was added
            prompt = max(1, prompt - self.prompt_offset)
        else:
            prompt = None
        own = leg.get("completion_tokens")
        if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
            self.tokens = self.leg_start + own  # the backend's count of this try, not its chunks
        usage = {**leg, "prompt_tokens": prompt, "completion_tokens": self.tokens}
        usage["total_tokens"] = (prompt or 0) + self.tokens
        usage.pop("prompt_tokens_details", None)  # the cached share described the resumed prompt
        self.usage = usage
        return usage

    # --- the continuation ---------------------------------------------------------------------------
    def continuation(self) -> dict[str, Any]:
        """The body that resumes the request where the client's text ends."""
        body = dict(self.body)
        text = self.text
        if self.chat:
            messages = list(body["messages"])
            last = messages[-1] if messages else None
            if body.get("continue_final_message") and isinstance(last, dict):
                messages[-1] = {**last, "content": str(last.get("content") or "") + text}
            else:
                messages.append({"role": "assistant", "content": text})
            body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
        else:
            prompt = body["prompt"]
            body["prompt"] = (prompt[0] if isinstance(prompt, list) else prompt) + text
            if body.get("max_tokens") is None:
                body["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
        for name in (*_CAPS, "min_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                body[name] = max(1 if name in _CAPS else 0, value - self.tokens)
        return body

    def resumed(self, prompt_offset: int, prompt_tokens: int | None = None) -> None:
        """A new try starts; its prompt holds ``prompt_offset`` tokens beyond the client's (as the
        gateway counts), and the client's prompt is ``prompt_tokens`` as the backend counts it."""
        self.leg += 1
        self.leg_start = self.tokens
        self.prompt_offset = prompt_offset
        self.prompt_tokens = prompt_tokens


def assemble(route: str, data: bytes) -> tuple[int, dict[str, Any]]:
    """A whole (non-streaming) answer from the stream the gateway read for it: status and body. An
    error event in the stream (the backend failed, the gateway drained) becomes that error."""
    chat = route == Route.CHAT
    head: dict[str, Any] = {}
    text: list[str] = []
    finish: str | None = None
    usage: dict[str, Any] | None = None
    for event in _events(data):
        obj = _payload(event)
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            code = obj["error"].get("code") if isinstance(obj["error"], dict) else None
            return (503 if code == "draining" else 502), obj
        if not head:
            head = {k: obj.get(k) for k in ("id", "created", "model")}
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        for c in obj.get("choices") or []:
            piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
            if isinstance(piece, str):
                text.append(piece)
            if c.get("finish_reason") is not None:
                finish = c["finish_reason"]
    content = "".join(text)
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content}}
    else:
        choice = {"index": 0, "text": content}
    choice.update(logprobs=None, finish_reason=finish)
    body = {**head, "object": "chat.completion" if chat else "text_completion", "choices": [choice]}
    body["usage"] = usage
    return 200, body
