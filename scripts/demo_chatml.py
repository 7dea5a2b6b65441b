"""The demo model's chat format (scripts/train_demo_model.py, scripts/demo_corpus.py): ChatML's special
tokens, the tokenizer's chat template, a chat rendered as the model was trained on it, and where the
assistant's replies lie in it (the tokens the model learns)."""

from __future__ import annotations

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"  # ids 0, 1, 2

# ChatML. With `tools` it also writes Qwen2.5's (Hermes) tool section, assistant <tool_call>s and
# <tool_response>s, so that `inflight serve` picks the hermes parser for the demo model and tool
# calls work on it (constrained by their grammar: the model was not trained on them). Without tools
# it renders exactly what the model was trained on (`render`).
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message.tool_calls %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + args + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def render(messages: list[dict[str, str]]) -> str:
    """ChatML, exactly what CHAT_TEMPLATE renders (its main checks it against the tokenizer)."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the assistant replies (content and their <|im_end|>) in a rendered chat."""
    head = f"{IM_START}assistant\n"
    spans, start = [], text.find(head)
    while start >= 0:
        begin = start + len(head)
        end = text.index(IM_END, begin) + len(IM_END)
        spans.append((begin, end))
        start = text.find(head, end)
    return spans
