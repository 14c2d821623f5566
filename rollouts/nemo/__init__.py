"""NeMo Gym environments: its config files (``config``), its head server (``head_server``) and the
mis-wiring of an agent URL that is NeMo Gym's own agent server (``miswiring``). No Django here."""
