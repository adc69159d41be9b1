"""The examples in the README run as documented; it holds the commands CI runs and an index
of every page of docs/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from anthropic.types import MessageParam
from openai.types.responses import ResponseInputItemParam

import codemode
from codemode.model import CodeMode
from tests.test_cli import normalised
from tests.test_model_specs import check_typed_dict
from tests.typecheck import ROOT


@pytest.mark.slow
def test_quickstart_runs() -> None:
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Completed [InputText(text='warmest: Lima at 19 C')]" in result.stdout
    assert "[notification from cell 1] all cities checked" in result.stdout
    assert "[cell 1 closed]" in result.stdout


def readme_block_after(marker: str) -> str:
    """The body of the fenced block that follows the line `marker` in the README."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index(marker + "\n") + len(marker) + 1 :]
    match = re.match(r"```\w*\n(.*?)```", after, re.DOTALL)
    assert match, f"no fenced block after {marker}"
    return match.group(1)


@pytest.mark.slow
def test_readme_first_look_runs_and_prints_what_the_readme_shows(tmp_path: Path) -> None:
    script = tmp_path / "first_look.py"
    script.write_text(
        readme_block_after("<!-- example: tests/test_examples.py runs this block -->")
    )
    # From elsewhere than the repository, as a reader's own script runs: codemode installed.
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    shown = readme_block_after("<!-- example output -->")
    assert normalised(result.stdout) == normalised(shown)


@pytest.mark.parametrize("marker", ["ci:setup", "ci:test", "ci:checks", "ci:main"])
def test_the_readme_has_each_command_ci_runs(marker: str) -> None:
    # .ci/run takes the first line of each block and fails without it (ci:main is this file's).
    command = readme_block_after(f"<!-- {marker} -->").strip()
    assert command, marker
    assert "\n" not in command, f"{marker}: .ci/run runs one line"


def test_the_readme_indexes_every_page_of_docs() -> None:
    text = (ROOT / "README.md").read_text()
    index = text[text.index("## Documentation\n") : text.index("## Layout\n")]
    listed = re.findall(r"^- `docs/([\w.-]+\.md)`:", index, re.MULTILINE)
    assert sorted(listed) == sorted(path.name for path in (ROOT / "docs").glob("*.md"))


@pytest.mark.slow
def test_readme_main_job_runs_and_prints_what_the_readme_shows() -> None:
    command = readme_block_after("<!-- ci:main -->").strip()
    result = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")
    shown = readme_block_after("prints exactly what the model would see:\n")
    assert normalised(result.stdout) == normalised(shown)


AGENT_TRANSCRIPT = """\
user: Which city is warmest today, and what is its forecast?
model -> exec ({exec_id})
codemode -> exec (running):
    Script running with cell ID 1
    Wall time N seconds
    Output:
    warmest: Lima at 19 C
model -> wait ({wait_id})
codemode -> wait (completed):
    Script completed
    Wall time N seconds
    Output:
    day 1: cloudy, 16 to 23 C
    day 2: rain, 17 to 24 C
    day 3: snow, 18 to 25 C
model: Here is what I found:
warmest: Lima at 19 C
day 1: cloudy, 16 to 23 C
day 2: rain, 17 to 24 C
day 3: snow, 18 to 25 C
"""


@pytest.mark.slow
@pytest.mark.parametrize("stream", [[], ["--stream"]], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("api", "exec_id", "wait_id"),
    [("openai", "call_1", "call_2"), ("anthropic", "toolu_1", "toolu_2")],
)
def test_agent_loop_runs_offline(api: str, exec_id: str, wait_id: str, stream: list[str]) -> None:
    # The real SDK client, against the scripted model on a local port (the example's
    # `--scripted`); streamed or not, the transcript is the same.
    result = subprocess.run(
        [sys.executable, "-m", "examples.agent_loop", "--scripted", "--api", api, *stream],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert normalised(result.stdout) == AGENT_TRANSCRIPT.format(exec_id=exec_id, wait_id=wait_id)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_agent_loop_conversation_has_the_sdk_shapes(api: str, stream: bool) -> None:
    # What the loop appends to the conversation is what the SDKs take back: every entry is
    # validated strictly (the model's own blocks as the SDK dumps them).
    from examples import agent_loop
    from examples.weather_tools import toolbox
    from tests.test_model_sdks import converse

    async with codemode.open_in_process_provider() as provider:
        session = await provider.create_session()
        code_mode = CodeMode(session, toolbox, toolbox.definitions())
        with trio.fail_after(30):
            _, requests = await converse(api, code_mode, agent_loop.QUESTION, stream=stream)
    conversation = requests[-1]["input" if api == "openai" else "messages"]
    entry_type = ResponseInputItemParam if api == "openai" else MessageParam
    for entry in conversation:
        check_typed_dict(entry_type, entry)
    assert len(conversation) == 5  # the question, two calls, two results
