"""Reward worker process: `python -m grpo_trainer.rewards._worker`.

Reads messages from stdin, answers on a private copy of stdout; the real stdout is pointed at
stderr first, so a reward function that prints cannot corrupt the protocol. Messages:
("load", key, pickled_fn) -> ("ok", None) | ("error", text);
("call", key, args)       -> ("ok", score) | ("error", text). Exits at end of input.
"""

from __future__ import annotations

import os
import pickle
import sys


def main() -> None:
    from grpo_trainer.rewards.protocol import as_score, describe_error, read_message, write_message

    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    functions = {}
    while True:
        try:
            message = read_message(0)
        except EOFError:
            return
        kind, key, payload = message
        try:
            if kind == "load":
                functions[key] = pickle.loads(payload)
                reply = ("ok", None)
            else:
                reply = ("ok", as_score(functions[key](*payload)))
        except (Exception, SystemExit) as exc:
            reply = ("error", describe_error(exc))
        write_message(reply_fd, reply)


if __name__ == "__main__":
    main()
