"""NeMo Gym's row key names (``nemo_gym/global_config.py``): the fields that identify a rollout row
(task, repeat, attempt) and its agent. No Django."""

TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"
AGENT_REF_KEY_NAME = "agent_ref"
