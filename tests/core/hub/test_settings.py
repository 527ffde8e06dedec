"""The one hub settings reader follows huggingface_hub's own rules (its constants, re-read in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from macapp.core.hub.settings import hub_settings

CASES = [
    {},
    {"HF_HUB_OFFLINE": "1"},
    {"HF_HUB_OFFLINE": "true"},
    {"HF_HUB_OFFLINE": "On"},
    {"HF_HUB_OFFLINE": "yes"},
    {"HF_HUB_OFFLINE": "0"},
    {"HF_HUB_OFFLINE": "false"},
    {"HF_HUB_OFFLINE": "no"},
    {"HF_HUB_OFFLINE": ""},
    {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "1"},  # an empty value falls through to the next variable
    {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},  # a set value wins
    {"TRANSFORMERS_OFFLINE": "TRUE"},
    {"HF_ENDPOINT": "http://127.0.0.1:9/"},
    {"HF_ENDPOINT": "https://mirror.example//"},
    {"HUGGINGFACE_CO_STAGING": "1", "HF_ENDPOINT": "http://ignored"},
]
VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HUGGINGFACE_CO_STAGING")

HF_READS = """
import importlib, json, os, sys
import huggingface_hub.constants as c
out = []
for case in json.loads(sys.argv[1]):
    for k in %r:
        os.environ.pop(k, None)
    os.environ.update(case)
    importlib.reload(c)
    out.append([c.ENDPOINT, c.HF_HUB_OFFLINE])
print(json.dumps(out))
""" % (VARS,)


@pytest.fixture(scope="module")
def huggingface_hub_says():
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    result = subprocess.run([sys.executable, "-c", HF_READS, json.dumps(CASES)], capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_the_same_endpoint_and_offline_mode_as_huggingface_hub(index, huggingface_hub_says, monkeypatch):
    for k in VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in CASES[index].items():
        monkeypatch.setenv(k, v)
    settings = hub_settings()
    assert [settings.endpoint, settings.offline] == huggingface_hub_says[index]


def test_the_download_code_and_the_catalog_read_the_same_settings(monkeypatch):
    from macapp.core import catalog
    from macapp.core.hub import api

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    monkeypatch.setenv("HF_HUB_OFFLINE", "")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "yes")
    assert api.endpoint() == catalog.hub_endpoint() == "http://127.0.0.1:9"
    assert api.is_offline() is catalog.hub_offline() is True
    monkeypatch.delenv("HF_ENDPOINT")
    assert catalog.hub_endpoint() is None and api.endpoint() == "https://huggingface.co"
    assert hub_settings().host_label == "huggingface.co"
