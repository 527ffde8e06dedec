"""Long-context mode in the window (#24): the library's context reaches past the native 262,144 tokens up to the
models' YaRN limit, the fit badge and details are sized at that context and say the model loads with YaRN, a load
from the library passes the chosen context (YaRN only past the native length), and the chat page says so in the
CLI's own sentence. A tiny model with a 512-token native length (the spin box's least) makes "past native" cheap."""

from __future__ import annotations

import pytest

from macapp.core import long_context
from macapp.core.catalog import Origin
from macapp.core.demo.tiny_model import make_tiny_model
from tests.fixtures.models import with_native_length
from tests.ui.helpers import GREEDY, send

NATIVE = 512
PAST = 1500  # past ×2 (1,024): ×4, whose card-proportion limit is 1,972


@pytest.fixture(scope="module")
def short_native(tiny_models_dir):
    return with_native_length(make_tiny_model(tiny_models_dir / "tiny-native512-window", kind="dense"), NATIVE)


def _load(qtbot, window, library, context):
    library.set_context(context)
    with qtbot.waitSignal(window.chat.controller.model_ready, timeout=60_000):
        assert library.request_load()
    return window.chat.controller.model_info


def _rope(window) -> str:
    model = window.chat.controller.engine.model.model
    return type(model.layers[3].self_attn.rope).__name__  # layer 3: the tiny model's full-attention layer


def test_the_context_reaches_the_yarn_limit_and_the_fit_follows(library):
    assert library.context_spin.maximum() == long_context.CARD_LONGEST == library.longest_context()
    library.context_slider.setValue(library.context_slider.maximum())
    assert library.context == 1_010_000  # the slider's last step: the card's "about 1,010,000 tokens"
    row = library.select("Qwen3.5-35B-A3B-4bit")
    assert row.estimate.context == 1_010_000 and row.estimate.yarn_factor == 4
    details = library.details
    assert details.long_context.isVisibleTo(details)
    assert "stretched 4×" in details.long_context.text() and "past the 262,144 it was trained on" in details.long_context.text()
    assert details.long_context.toolTip() == long_context.notice(4)  # the technical name, as the CLI says it
    assert "1,010,000 tokens" in details.total.text()
    at_1m = row.estimate.total_bytes
    library.set_context(524_288)
    row = library.select("Qwen3.5-35B-A3B-4bit")
    assert row.estimate.yarn_factor == 2 and row.estimate.total_bytes < at_1m
    assert "stretched 2×" in details.long_context.text()
    library.set_context(262_144)  # native: nothing changes, nothing said
    row = library.select("Qwen3.5-35B-A3B-4bit")
    assert row.estimate.yarn_factor is None and not details.long_context.isVisibleTo(details)


def test_a_load_past_native_turns_yarn_on_and_the_window_says_so(qtbot, window, library, settings, short_native):
    settings.set("chat.sampling.instant", GREEDY)
    library.open_local_folder(str(short_native))
    row = library.selected_row()
    assert row.ref.origin is Origin.LOCAL and row.ref.arch.native == NATIVE
    library.set_context(PAST)
    row = library.selected_row()
    assert row.estimate.context == PAST and row.estimate.yarn_factor == 4 and row.estimate.verdict == "fits"
    assert "stretched 4×" in library.details.long_context.text()

    info = _load(qtbot, window, library, PAST)
    chat = window.chat
    assert info.yarn_factor == 4 and info.native_context == NATIVE and info.max_context >= PAST
    assert _rope(window) == "YarnRoPE"
    said = long_context.notice(4)
    assert chat.long_context_note.isVisibleTo(chat) and chat.long_context_note.text().lower() == said.lower()
    assert "YaRN ×4" in window.status.model_label.text()
    # a prompt past the native length is read and answered within the chosen context
    reply = send(chat, qtbot, "the answer is here and there " * 100, thinking=False)
    assert reply.stats is not None and reply.stats.prompt_tokens > NATIVE and reply.stats.generation_tokens > 0
    assert chat.controller.session.options.context_limit == PAST
    assert "of 1,500 tokens" in chat.meter.text()

    # at the native length nothing changes: no YaRN, nothing said
    info = _load(qtbot, window, library, NATIVE)
    assert info.yarn_factor is None and info.max_context == NATIVE
    assert _rope(window) == "RoPE"
    assert not chat.long_context_note.isVisibleTo(chat) and "YaRN" not in window.status.model_label.text()


def test_a_context_past_a_models_own_limit_loads_it_at_that_limit(qtbot, window, library, short_native):
    library.open_local_folder(str(short_native))
    library.set_context(1_010_000)  # past the tiny model's own YaRN ×4 limit: sized and loaded at it
    row = library.selected_row()
    longest = row.ref.arch.max_position_embeddings
    assert longest == long_context.yarn_longest(NATIVE, 4) and row.estimate.context == longest
    assert f"{longest:,} tokens" in library.details.total.text()
    info = _load(qtbot, window, library, 1_010_000)
    assert info.yarn_factor == 4 and info.max_context == longest
    window.chat.unload_model()
    assert not window.chat.long_context_note.isVisibleTo(window.chat)
