"""API requests with pictures reuse the prompt checkpoints (macapp.core.serving.pictures + the serving runner), on the
tiny vision model: a follow-up about the same picture restores the conversation, picture included, without
running the tower again, and answers exactly as a from-scratch read; a different picture is never reused past it;
a new picture after a restored checkpoint continues the mRoPE positions as a from-scratch read has them."""

from __future__ import annotations

import pytest

from macapp.core.sampling import greedy
from macapp.core.serving.render import render
from macapp.core.serving.requests import ChatMessage, Completed, CompletionRequest, ImagePart, Role
from macapp.core.serving.runner import ServingEngine, ServingOptions
from macapp.core.engine import pictures as engine_pictures
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.serving import pictures as request_pictures
from tests.core.engine.helpers import TIMEOUT, on_worker
from tests.fixtures.vision import picture_bytes

SYSTEM = ChatMessage(Role.SYSTEM, "You look at pictures and answer questions about them. " * 6)


def _image(seed: int, size=(128, 96)) -> ImagePart:
    return ImagePart(picture_bytes(size, seed=seed), "image/png")


def _user(text: str, *images: ImagePart) -> ChatMessage:
    return ChatMessage(Role.USER, text, images=images)


def _ask(messages, sampling) -> CompletionRequest:
    return CompletionRequest(messages=tuple(messages), sampling=sampling, thinking=False)


def _run(serving: ServingEngine, request: CompletionRequest) -> Completed:
    done = list(serving.submit(request).events(timeout=TIMEOUT))[-1]
    assert isinstance(done, Completed), done
    return done


def _encoded(engine) -> int:
    """How many pictures the tower has run on (on the worker: it may attach the tower)."""
    return on_worker(engine, lambda m: engine_pictures.vision_for(m).pictures_encoded)


def _layout(engine, messages) -> request_pictures.PictureRequest:
    """The request's prompt as the runner lays it out (run on the worker: it may attach the tower)."""
    rendered = render(engine.model.tokenizer, _ask(messages, greedy(1)))

    return on_worker(engine, lambda m: request_pictures.prepare(m, rendered.tokens, rendered.boundaries, rendered.images, 4096))


def test_the_pool_key_tells_pictures_apart_by_content(engine):
    a = _layout(engine, [SYSTEM, _user("describe it", _image(1))])
    again = _layout(engine, [SYSTEM, _user("describe it", _image(1))])
    other = _layout(engine, [SYSTEM, _user("describe it", _image(2))])
    assert a.tokens == other.tokens  # the placeholders alone look alike ...
    assert a.key == again.key and a.key != other.key  # ... the key does not
    first = a.starts[0]
    assert a.key[:first] == other.key[:first] and a.key[first] != other.key[first]
    assert a.counts == [12] and set(a.key[first : first + 12]) == {request_pictures.digest(a.pictures[0])}
    assert all(b <= first or b >= first + 12 for b in a.boundaries)  # no boundary cuts a picture


def test_a_follow_up_about_the_same_picture_reuses_it_and_answers_as_a_fresh_read(engine, long_reply):
    pooled = ServingEngine(engine)
    fresh = ServingEngine(engine, ServingOptions(pool_bytes=1))  # nothing fits: every prompt read afresh
    first_turn = [SYSTEM, _user("describe it", _image(3))]
    first = _run(pooled, _ask(first_turn, long_reply))
    follow_up = [*first_turn, ChatMessage(Role.ASSISTANT, first.text), _user("and what colour is it?")]
    layout = _layout(engine, follow_up)
    before = _encoded(engine)
    served = _run(pooled, _ask(follow_up, long_reply))
    assert _encoded(engine) == before  # the tower did not run again for the picture
    picture_end = layout.starts[0] + layout.counts[0]
    reply_start = layout.boundaries[-4]  # before the earlier reply (then: the new user turn, the generation prompt, the last token)
    assert served.usage.cached_tokens == reply_start > picture_end  # the conversation, picture included
    assert served.usage.prompt_tokens == len(layout.tokens)
    reference = _run(fresh, _ask(follow_up, long_reply))
    assert _encoded(engine) == before + 1 and reference.usage.cached_tokens == 0
    assert served.text == reference.text and len(served.text) > 20
    restored = pooled.pool.longest_prefix(layout.key[: reply_start + 1])  # kept with its picture's positions
    full, _spans = _positions(engine, layout, None)
    assert restored.length == reply_start and restored.rope_delta == full[0][0][reply_start] - reply_start < 0
    assert [(s.start, s.end) for s in restored.spans] == [(0, reply_start)]  # the first read, cut where it was kept


def test_a_changed_picture_is_not_reused_past_it(engine, long_reply):
    pooled = ServingEngine(engine)
    fresh = ServingEngine(engine, ServingOptions(pool_bytes=1))
    first = _run(pooled, _ask([SYSTEM, _user("describe it", _image(4))], long_reply))
    changed = [SYSTEM, _user("describe it", _image(5)), ChatMessage(Role.ASSISTANT, first.text), _user("and what colour is it?")]
    layout = _layout(engine, changed)
    before = _encoded(engine)
    served = _run(pooled, _ask(changed, long_reply))
    assert served.usage.cached_tokens <= layout.starts[0]  # at most the system prompt before the picture
    assert _encoded(engine) == before + 1
    assert served.text == _run(fresh, _ask(changed, long_reply)).text


def test_a_new_picture_after_a_restored_one_gets_the_positions_of_a_fresh_read(engine, long_reply):
    pooled = ServingEngine(engine)
    fresh = ServingEngine(engine, ServingOptions(pool_bytes=1))
    messages = [SYSTEM, _user("describe it", _image(6))]
    first = _run(pooled, _ask(messages, long_reply))
    messages += [ChatMessage(Role.ASSISTANT, first.text), _user("and this one, next to it?", _image(7, (96, 64)))]
    before = _encoded(engine)
    served = _run(pooled, _ask(messages, long_reply))
    assert _encoded(engine) == before + 1  # only the new picture
    assert served.usage.cached_tokens > 12
    assert served.text == _run(fresh, _ask(messages, long_reply)).text
    messages += [ChatMessage(Role.ASSISTANT, served.text), _user("which is brighter?")]
    before = _encoded(engine)
    third = _run(pooled, _ask(messages, long_reply))
    assert _encoded(engine) == before and third.usage.cached_tokens > served.usage.cached_tokens
    assert third.text == _run(fresh, _ask(messages, long_reply)).text


def _positions(engine, layout, restored: PromptCache | None):
    """The mRoPE positions of the tokens after `restored` (a cache as restored from a checkpoint: its tokens and
    pictures; None: from scratch) as `begin` sets them up (list of lists), and the pictures' spans it then holds."""
    from mlx_lm.models.cache import make_prompt_cache

    def work(m):
        held = restored.tokens if restored is not None else []
        cache = PromptCache(make_prompt_cache(m.model), held, list(restored.spans) if restored is not None else [])
        for layer in cache.layers:  # a cache of `cached` tokens, as restored (only the offset counts here)
            if hasattr(layer, "offset"):
                layer.offset = len(held)
        request_pictures.begin(layout, cache)
        positions = engine_pictures.vision_for(m).lm.positions(len(held), len(layout.tokens) - len(held)).tolist()
        return positions, list(cache.spans)

    return on_worker(engine, work)


@pytest.mark.parametrize("later_picture", [False, True])
def test_positions_after_a_checkpoint_are_a_fresh_reads(engine, later_picture):
    """What the follow-up reads from a checkpoint gets the very positions a from-scratch read gives it (after a
    picture they run behind the token count: the checkpoint keeps the picture's span)."""
    last = _user("and this one?", _image(8, (96, 64))) if later_picture else _user("and what colour is it?")
    layout = _layout(engine, [SYSTEM, _user("describe it", _image(3)), ChatMessage(Role.ASSISTANT, "A cat."), last])
    full, spans = _positions(engine, layout, None)
    for cached in layout.boundaries[1:]:  # past the first picture
        restored = PromptCache([], layout.key[:cached], [s.until(cached) for s in spans if s.start < cached])  # as a checkpoint keeps it
        assert sum(s.delta for s in restored.spans) == full[0][0][cached] - cached < 0
        tail, _ = _positions(engine, layout, restored)
        assert tail == [[row[cached:] for row in axis] for axis in full]


def test_a_picture_request_is_answered_while_a_long_reply_streams(engine, long_reply):
    """A picture request is read alone at once (the tower's features, mlx-vlm's positions), then decodes in mlx-lm's
    batch beside the long reply, its rotary positions moved by its picture's delta; its answer is the one it gets
    alone."""
    import threading

    from macapp.core.events import AnswerDelta

    serving = ServingEngine(engine, ServingOptions(pool_bytes=0))
    question = _ask([SYSTEM, _user("What is in this picture?", _image(5))], long_reply)
    alone = _run(serving, question)
    vocab = engine.model.tokenizer.get_vocab()
    endless = greedy(3000, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})
    long = serving.submit(_ask([_user("Tell me a long story.")], endless))
    streaming = threading.Event()
    long.add_listener(lambda e: streaming.set() if isinstance(e, AnswerDelta) else None)
    assert streaming.wait(TIMEOUT)
    batch = serving.batch
    decoding_beside: list[int] = []  # sequences in the loop while its reply streamed
    job = serving.submit(question)
    job.add_listener(lambda e: decoding_beside.append(batch.active) if isinstance(e, AnswerDelta) else None)
    beside = job.wait(TIMEOUT)
    assert isinstance(beside, Completed)
    assert not long.done  # answered while the long reply was still going, not after it
    assert max(decoding_beside) >= 2  # read alone, then decoded in mlx-lm's batch beside the long reply
    assert beside.text == alone.text and beside.usage.completion_tokens == 24  # at its pictures' positions
    long.stop()
    assert isinstance(long.wait(TIMEOUT), Completed)
    serving.close()
