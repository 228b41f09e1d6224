"""Start the dashboard for hosting: ``python -m batching.ui.serve [streamlit run options]`` (deploy/ runs it).

Streamlit 1.67 reads the secrets files while it starts (``streamlit.web.bootstrap`` and the cookie secret in
``streamlit.web.server.server_util.get_cookie_secret``): a file that is not UTF-8, or an ``auth`` that is not a table,
makes ``streamlit run`` exit with a traceback, and a service manager restarts it into the same crash forever. This
launcher first checks every secrets file as the pages do (``access.secrets_problem``: readable, UTF-8, valid TOML,
``[auth]`` spelt and typed right and complete). When all is well it becomes ``streamlit run app.py`` with the options
given (same process, ``exec``). When not, it prints the problem once and starts the server without the secrets, with
the problem in ``BATCHING_SECRETS_PROBLEM``: every page then shows only that error (fail closed: no page, no upload)
and the health check answers, until the host fixes the file and restarts the service.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app.py"


def _flag_values(argv: list[str], name: str) -> list[str]:
    """The values of ``--name value`` and ``--name=value`` in ``streamlit run`` options."""
    out = []
    for i, arg in enumerate(argv):
        if arg == f"--{name}" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith(f"--{name}="):
            out.append(arg.split("=", 1)[1])
    return out


def check(argv: list[str]) -> str | None:
    """The secrets problem the pages would show, with the config files, environment and ``argv``'s options."""
    from streamlit import config

    from batching.ui import access

    import streamlit as st
    from streamlit.runtime.secrets import Secrets

    options = config.get_config_options()
    files = _flag_values(argv, "secrets.files")
    before = (options["secrets.files"].value, options["secrets.files"].where_defined)
    if files:
        config.set_option("secrets.files", files, "command-line")
    os.environ.pop(access.LAUNCH_PROBLEM_ENV, None)  # only this launcher sets it
    saved, st.secrets = st.secrets, Secrets()  # what the check parses stays in its own store
    st.secrets._file_watchers_installed = True  # no polling thread for a store thrown away
    try:
        return access.secrets_problem()
    finally:  # the check leaves the process's options and secrets as it found them
        config.set_option("secrets.files", *before)
        st.secrets = saved


def command(argv: list[str], problem: str | None) -> tuple[list[str], dict[str, str]]:
    """The ``streamlit run`` command line and environment to start (without the secrets when there is a problem)."""
    from batching.ui import access

    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), *argv]
    env = dict(os.environ)
    env.pop(access.LAUNCH_PROBLEM_ENV, None)
    if problem is not None:
        # a path that does not exist: Streamlit finds no secrets and starts; the pages read the problem instead
        absent = Path(tempfile.mkdtemp(prefix="batching-explorer-no-secrets-")) / "absent" / "secrets.toml"
        cmd = [c for i, c in enumerate(cmd) if not (c == "--secrets.files" or c.startswith("--secrets.files=")
                                                  or (i and cmd[i - 1] == "--secrets.files"))]
        cmd += ["--secrets.files", str(absent)]
        env[access.LAUNCH_PROBLEM_ENV] = problem
    return cmd, env


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = check(argv)
    if problem is not None:
        print(f"batching-explorer: sign-in is configured wrongly, serving only this error: {problem}",
              file=sys.stderr, flush=True)
    cmd, env = command(argv, problem)
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
