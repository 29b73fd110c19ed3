"""benchmarks/top_k.py: the beam step's top K, lax.top_k against search.top_k_by_blocks."""

from benchmarks import top_k


def test_both_top_ks_are_timed_and_give_the_same_bits():
  records = top_k.time_top_k([40, 300], sentences=3, beam_size=2, rounds=2, steps=2)
  assert [r["scores"] for r in records] == [80, 600]
  for r in records:
    assert r["same_bits"] is True
    assert r["lax_ms"] > 0 and r["blocks_ms"] > 0
    assert r["speedup"] == r["lax_ms"] / r["blocks_ms"]
  lines = top_k.report_lines(records)
  assert "| 300 | 600 | 120 |" in lines[1] and "NO" not in lines[1]
