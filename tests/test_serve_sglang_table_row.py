"""The SGLang start-up table's request-to-token row shows the table's own rows and width (serve/sglang_requests.py):
from 0.4.7 the table has max_num_reqs rows, not max_num_reqs + 1."""

from __future__ import annotations

from typer.testing import CliRunner

from vramplan.cli.main import app

ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_request_table_row_uses_rows_of_release() -> None:
    # SGLang 0.5.10, Qwen3-30B-A3B (max_position_embeddings 40,960), given 8 requests, no DP:
    # _resolve_max_num_reqs: min(8 // 1, estimated) = 8 rows (no extra row from 0.4.7), width 40,960 + 4 = 40,964
    res = CliRunner().invoke(app, ["serve", "--engine", "sglang", "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "H100",
                                   "--tp", "4", "--max-running-requests", "8", "--sglang-version", "0.5.10"], env=ENV)
    assert res.exit_code == 0, res.stdout
    assert "8 rows x 40,964 slots x 4 B" in res.stdout
    assert "(8 + 1)" not in res.stdout
