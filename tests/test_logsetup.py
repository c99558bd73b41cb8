"""Logging set-up (hostmq/logsetup.py): level precedence, the journal's format, rotated files."""
from __future__ import annotations

import logging
import os

import pytest

from hostmq import logsetup
from hostmq.config import Config, LoggingConfig
from hostmq.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    env = os.environ.get(logsetup.LEVEL_ENV)
    yield
    for h in root.handlers:
        h.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    if env is None:
        os.environ.pop(logsetup.LEVEL_ENV, None)
    else:
        os.environ[logsetup.LEVEL_ENV] = env


def test_the_command_line_beats_the_environment_which_beats_the_config():
    cfg = LoggingConfig(level="warning")
    assert logsetup.chosen_level(cfg, env={}) == "WARNING"
    assert logsetup.chosen_level(cfg, env={"HOSTMQ_LOG_LEVEL": "debug"}) == "DEBUG"
    assert logsetup.chosen_level(cfg, "error", env={"HOSTMQ_LOG_LEVEL": "debug"}) == "ERROR"
    with pytest.raises(ConfigError):
        logsetup.chosen_level(cfg, env={"HOSTMQ_LOG_LEVEL": "loud"})


def test_the_logging_section_is_checked():
    assert Config.from_dict({"logging": {"level": "DEBUG", "file": "hostmq.log"}}).logging.file == "hostmq.log"
    for bad in ({"level": "LOUD"}, {"max_bytes": 10}, {"backups": 0}, {"colour": True}):
        with pytest.raises(ConfigError):
            Config.from_dict({"logging": bad})


def test_each_process_has_its_own_file_under_the_roots_logs():
    assert logsetup.log_file_for("hostmq.log", "/srv/r", "broker-a.writer") == "/srv/r/logs/hostmq.broker-a.writer.log"
    assert logsetup.log_file_for("/var/log/mq", "/srv/r", "namesrv-0") == "/var/log/mq.namesrv-0.log"
    assert logsetup.log_file_for("x.log", "/srv/r") == "/srv/r/logs/x.log"


def test_the_journal_is_recognised_by_the_stream_it_named(tmp_path):
    with open(tmp_path / "stream", "w") as f, open(tmp_path / "other", "w") as g:
        st = os.fstat(f.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logsetup.under_journal(f, env)
        assert not logsetup.under_journal(g, env)      # stderr was redirected elsewhere
        assert not logsetup.under_journal(f, {})


def test_journal_lines_carry_the_priority_and_no_timestamp():
    fmt = logsetup.JournalFormatter("broker-a.writer")
    rec = logging.LogRecord("hostmq.broker.writer", logging.WARNING, __file__, 1, "disk %s\nfull", ("a",), None)
    assert fmt.format(rec) == "<4>broker-a.writer hostmq.broker.writer WARNING disk a\n<4>full"


def test_a_log_file_is_rotated_by_size(tmp_path, restore_logging):
    cfg = LoggingConfig(file="hostmq.log", max_bytes=4096, backups=2)
    logsetup.configure(cfg, str(tmp_path), "INFO", "broker-a")
    assert os.environ[logsetup.LEVEL_ENV] == "INFO"
    log = logging.getLogger("hostmq.test")
    for i in range(400):
        log.info("line %d of a log that outgrows its file", i)
    log.debug("not at INFO")
    for h in logging.getLogger().handlers:
        h.flush()
    names = sorted(os.listdir(tmp_path / "logs"))
    assert names == ["hostmq.broker-a.log", "hostmq.broker-a.log.1", "hostmq.broker-a.log.2"]
    assert all(os.path.getsize(tmp_path / "logs" / n) <= 4096 for n in names)
    text = (tmp_path / "logs" / "hostmq.broker-a.log").read_text()
    assert "line 399 of" in text and " broker-a hostmq.test INFO " in text and "not at INFO" not in text
