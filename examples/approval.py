"""One agent turn with a dangerous tool: the cell asks, the application decides, the model reads
what happened (docs/governance.md).

Runs offline: the model's `exec` call is written out below, and the person who approves is a
scripted answer (an application would ask its user, in its UI, and await the answer):

    python -m examples.approval
"""

from __future__ import annotations

import trio

import codemode

toolbox = codemode.Toolbox()
sent: list[str] = []


@toolbox.tool
def find_customer(name: str) -> dict[str, str]:
    """A customer's record."""
    return {"name": name, "email": f"{name.lower()}@example.com"}


@toolbox.tool(needs_approval=True)
def send_mail(to: str, subject: str) -> str:
    """Sends an email (a side effect: needs approval)."""
    sent.append(to)
    return f"sent '{subject}' to {to}"


# What the model wrote: look two customers up, mail both.
CELL = """
for (const name of ["Ada", "Grace"]) {
  const customer = await tools.find_customer({ name });
  try {
    text(await tools.send_mail({ to: customer.email, subject: "Your invoice" }));
  } catch (error) {
    text(error.message);  // a denial is an Error the cell can catch
  }
}
"""


async def approver(request: codemode.ApprovalRequest) -> codemode.Approve | codemode.Deny:
    """The scripted person: yes for Ada, no for anyone else."""
    print(f"approval asked: tools.{request.identifier}({request.arguments}) [{request.call_id}]")
    await trio.sleep(0.2)  # the person reads the question
    if request.arguments["to"].startswith("ada"):
        return codemode.Approve()
    return codemode.Deny("the user declined")


async def main() -> None:
    async with codemode.open_process_provider() as provider:
        session = await provider.create_session()
        code_mode = codemode.CodeMode(session, toolbox, toolbox.definitions(), approver=approver)
        output = await code_mode.exec("call-1", CELL)
        print(f"\n{output.text}\n")  # what the model reads
        # The exec returns as soon as a call waits for approval (the model may tell the user);
        # the model then waits for the cell, as it would for any running cell.
        while output.status == "running":
            output = await code_mode.wait({"cell_id": output.cell_id})
            print(f"{output.text}\n")
        for entry in code_mode.journal(output.cell_id or ""):
            print(f"journal: tools.{entry.tool} {entry.call_id} {entry.outcome}")


if __name__ == "__main__":
    trio.run(main)
