"""Content search across a run: which rollouts hold a text in any trajectory item, call a
tool, have a tool output holding a text, or failed with a message holding a text.

``text`` (pure, no Django): what an item's searchable text is (``TrajectoryItem.search_text``).
``index``: the backend's index over that text (FTS5 trigram on SQLite, pg_trgm GIN on PostgreSQL).
``queries``: the run page's filters, through that index. The models import ``text`` only.
"""

# Migration 0013 imports these from ``rollouts.search`` (migrations are never edited), and so
# does the dispatcher (``fill_missing``).
from rollouts.search.index import FTS_TABLE, ITEM_TABLE, TRGM_INDEX, ensure_index
from rollouts.search.text import fill_missing, item_search_text

__all__ = ["FTS_TABLE", "ITEM_TABLE", "TRGM_INDEX", "ensure_index", "fill_missing", "item_search_text"]
