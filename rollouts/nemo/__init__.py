"""NeMo Gym's own rules: its config files (``config``), its head server (``head_server``), the
mis-wiring of an agent URL that is NeMo Gym's own agent server (``miswiring``), its row key names
(``keys``), which metrics are primary (``metrics_config``) and the reader of JSONL files (``jsonl``).
No Django here."""
