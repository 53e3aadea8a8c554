"""scripts/bench_serving.py's parts: what it runs (`settings`), the rewrites it carries (`rewrites`), the
processes that measure (`workers`) and the tables it writes (`report`)."""
