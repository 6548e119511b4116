"""``halsift eval retrieval``: R@1/5/10 image->text and text->image of an open_clip model on a retrieval set
(flags: :class:`halsift.eval.runs.retrieval.RetrievalEvalConfig`; library:
:func:`halsift.eval.runs.retrieval.run_retrieval`)."""

from halsift.eval.runs.retrieval import RetrievalEvalConfig as CONFIG  # noqa: F401 (the flags' class, for docs/config.md)
from halsift.launch.eval_command import eval_command

HELP, add_arguments, run = eval_command("retrieval", {"model": "ARCH", "pretrained": "TAG|PATH",
                                                      "data": "DIR|JSONL", "out": "DIR"})
