"""The lab's JupyterLab settings reach JupyterLab's own reader, and keep what was there."""

from __future__ import annotations

import json

from tools import jupyter_settings


def test_the_settings_turn_the_news_prompt_off_where_jupyterlab_reads_them(tmp_path, monkeypatch):
    from jupyterlab_server.settings_utils import _get_overrides

    target = tmp_path / "labconfig" / "default_setting_overrides.json"
    target.parent.mkdir()
    target.write_text(json.dumps({"@jupyterlab/apputils-extension:notification": {"doNotDisturbMode": True},
                                  "other:plugin": {"x": 1}}))
    assert jupyter_settings.install(tmp_path) == target
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "nothing-here"))
    overrides, error = _get_overrides(str(tmp_path / "no-app-settings"))
    assert not error
    assert overrides["@jupyterlab/apputils-extension:notification"] == {
        "doNotDisturbMode": True, "fetchNews": "false", "checkForUpdates": False}  # "none" would ask
    assert overrides["other:plugin"] == {"x": 1}
    assert overrides["@jupyterlab/notebook-extension:tracker"]["codeCellConfig"]["lineNumbers"] is True
