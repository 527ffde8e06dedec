"""Typed request models of the three APIs (pydantic 2): each body is validated into a model and read from it into the
core's CompletionRequest (macapp.core.serving.requests); a refused value is a 400 naming the field (reading.py).

    common.py               the base model, the refusal, shared field types (numbers, seeds, images, stop, ...)
    reading.py              a body -> a model, or the ApiError naming the first field at fault
    openai_chat.py          POST /v1/chat/completions
    anthropic_blocks.py     the content blocks of Anthropic messages
    anthropic_messages.py   POST /v1/messages and /v1/messages/count_tokens
    responses_input.py      the input items of POST /v1/responses, and the conversation they make
    responses_body.py       POST /v1/responses: the body and its options
"""
