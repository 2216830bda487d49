"""A library Runner as a caller of the context-parity matrix (test_context_parity.py):

    python runner_run.py --json PATH --unit-type scope|service -- ARGV...

runs ARGV with ``corral_systemd.Runner(mode="enforced")`` in this process
(the caller of the command, as corral in-process is), its stdin this
process's, its output through the Runner to this process's stdout and
stderr (``capture=False``); writes the record to PATH and exits with the
run's exit code. An exec that fails, or a run corral refuses, says why on
stderr in one line and exits as the CLI does (127/126, 125)."""

import json
import sys

import corral_systemd as corral
from corral_systemd.common.errors import CorralError
from corral_systemd.kernel import startup


def main(args: list[str]) -> int:
    split = args.index("--")
    options, argv = dict(zip(args[:split:2], args[1:split:2], strict=True)), args[split + 1 :]
    startup.prepare()  # the environment as given (the interpreter's locale coercion undone), as corral's own start
    try:
        with corral.Runner(mode="enforced") as runner:
            result = runner.run(argv, unit_type=options["--unit-type"], stdin="inherit", capture=False)
    except (corral.NotFound, corral.CannotExecute) as exc:
        print(f"corral: {exc}", file=sys.stderr)
        result = exc.result
    except CorralError as exc:
        print(f"corral: {exc}", file=sys.stderr)
        return exc.exit_code
    with open(options["--json"], "w") as f:
        json.dump(result.model_dump(mode="json", exclude={"stdout", "stderr"}), f)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
