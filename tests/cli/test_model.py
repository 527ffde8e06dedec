"""The model flags chat and serve share: --context's floor, and a model that cannot be loaded as a usage error."""

from __future__ import annotations

import argparse

import pytest

from macapp.cli import UsageError
from macapp.cli.model import MIN_CONTEXT, add_cache_arguments, add_model_argument, check_cache_arguments, load_model


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_model_argument(parser)
    add_cache_arguments(parser)
    return parser


def test_the_flags_parse_as_both_commands_take_them():
    args = _parser().parse_args(["-m", "Qwen3.5-4B", "--context", "128k", "--kv-bits", "8"])
    assert (args.model, args.context, args.kv_bits) == ("Qwen3.5-4B", 131072, 8)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--model", "m", "--kv-bits", "3"])


@pytest.mark.parametrize(("context", "refused"), [(None, False), (MIN_CONTEXT, False), (MIN_CONTEXT - 1, True), (0, True)])
def test_a_context_too_small_for_a_turn_is_refused(context, refused):
    args = argparse.Namespace(context=context)
    if refused:
        with pytest.raises(UsageError, match=f"at least {MIN_CONTEXT}"):
            check_cache_arguments(args)
    else:
        check_cache_arguments(args)


def test_a_model_that_is_not_there_is_a_usage_error_naming_it(tmp_path):
    from macapp.core.engine import Engine

    engine = Engine()
    try:
        with pytest.raises(UsageError, match="nowhere"):
            load_model(engine, str(tmp_path / "nowhere"))
        (tmp_path / "empty").mkdir()
        with pytest.raises(UsageError, match="empty"):
            load_model(engine, str(tmp_path / "empty"))
    finally:
        engine.close()
