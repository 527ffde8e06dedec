"""A request made ready to run: rendered and tokenized once, checked against the context, max_tokens clamped.

`prepare` runs on any thread (it reads only the tokenizer, no MLX), so the server calls it off its event loop;
the runner then takes the `PreparedRequest` as it is and never renders the prompt again. A prepared request
belongs to the model it was rendered for: one prepared before a reload is refused when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.engine.limits import context_limit, turn_sampling
from macapp.core.engine.options import SessionOptions
from macapp.core.sampling import SamplingParams, check_logit_bias
from macapp.core.serving.bounds import PromptTooLong, check_prompt
from macapp.core.serving.pictures import extra_image_tokens
from macapp.core.serving.render import RenderedPrompt, RenderError, render
from macapp.core.serving.requests import INVALID_REQUEST, CompletionRequest

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel


@dataclass(frozen=True)
class PreparedRequest:
    request: CompletionRequest  # as sent, with sampling.max_tokens clamped to the room the prompt leaves
    rendered: RenderedPrompt
    prompt_tokens: int  # the prompt's length, each picture counted as its image tokens
    model: "LoadedModel"  # the model it was rendered for

    @property
    def client(self) -> str:
        return self.request.client


@dataclass(frozen=True)
class RunSettings:
    params: SamplingParams  # max_tokens within the room the prompt leaves in the context
    budget: int | None  # the thinking budget, when the prompt opened a reasoning
    limit: int  # the context limit


def run_settings(prepared: PreparedRequest, m: "LoadedModel", options: SessionOptions, budget_bytes: int | None, prompt_len: int) -> RunSettings:
    """How a prepared request runs on the worker (either path): its settings checked, and its `prompt_len` tokens
    (pictures laid out) within the context and the memory budget (EngineError otherwise)."""
    request, rendered = prepared.request, prepared.rendered
    budget = request.thinking_budget if rendered.thinking else None
    params = turn_sampling(request.sampling, rendered.thinking, budget, options)
    limit = context_limit(m, options, prompt_len, 0, budget_bytes)
    return RunSettings(replace(params, max_tokens=min(params.max_tokens, limit - prompt_len)), budget, limit)


def render_for(m: "LoadedModel", request: CompletionRequest) -> RenderedPrompt:
    """The request through the model's chat template; EngineError INVALID_REQUEST for what the template refuses."""
    try:
        return render(m.tokenizer, request)
    except RenderError as exc:
        raise EngineError(str(exc), INVALID_REQUEST) from exc


def prompt_length(m: "LoadedModel", rendered: RenderedPrompt) -> int:
    """The prompt's tokens with each picture's placeholder counted as its image tokens (from the sizes: no tower run)."""
    if not rendered.images:
        return len(rendered.tokens)
    return len(rendered.tokens) + extra_image_tokens(m.path, rendered.images)


def check_vocabulary(m: "LoadedModel", request: CompletionRequest) -> None:
    """logit_bias may only name the model's own token ids (an id past the vocabulary would crash MLX)."""
    bias = request.sampling.logit_bias
    if not bias:
        return
    try:
        check_logit_bias(bias, vocabulary_size(m))
    except ValueError as exc:
        raise EngineError(str(exc), INVALID_REQUEST) from exc


def vocabulary_size(m: "LoadedModel") -> int:
    """The size of the model's output layer (token ids are below it)."""
    config = m.config if isinstance(m.config, dict) else {}
    nested = config.get("text_config")
    text = nested if isinstance(nested, dict) else config
    size = text.get("vocab_size") or config.get("vocab_size")
    return int(size) if isinstance(size, (int, float, str)) and size else len(m.tokenizer.get_vocab())


def refuse_oversized(m: "LoadedModel", request: CompletionRequest, context_limit: int) -> None:
    """A prompt that certainly cannot fit is refused before it is tokenized whole (bounds.py: a 10 MiB prompt
    would otherwise take seconds and gigabytes to be refused)."""
    try:
        check_prompt(m.tokenizer, request, context_limit)
    except PromptTooLong as exc:
        raise EngineError(str(exc), ev.CONTEXT_LIMIT) from exc
    except RenderError:
        return  # render_for refuses it in its own words


def prepare(m: "LoadedModel", request: CompletionRequest, context_limit: int) -> PreparedRequest:
    """Render `request` for `m`, refuse it when its prompt leaves no room in `context_limit` tokens (EngineError
    CONTEXT_LIMIT, the message says by how much and what to do), and clamp its max_tokens to the room left."""
    check_vocabulary(m, request)
    refuse_oversized(m, request, context_limit)
    rendered = render_for(m, request)
    prompt_tokens = prompt_length(m, rendered)
    room = context_limit - prompt_tokens
    if room < 1:
        pictures = sum(len(msg.images) for msg in request.messages)
        held = f" with its {pictures} picture{'s' * (pictures != 1)}' image tokens" if pictures else ""
        fewer = "send fewer or smaller pictures, " if pictures else ""
        raise EngineError(
            f"This prompt is {prompt_tokens} tokens{held}, over the server's context limit of {context_limit} tokens: "
            f"{fewer}shorten the conversation (or start the server with a larger --context).",
            ev.CONTEXT_LIMIT,
        )
    if request.sampling.max_tokens > room:
        request = replace(request, sampling=replace(request.sampling, max_tokens=room))
    return PreparedRequest(request, rendered, prompt_tokens, m)
