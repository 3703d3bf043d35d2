"""Progress of prepare's encoding: log lines with pairs done, rate and time left."""

from translate.data.progress import Progress


def test_log_lines_every_so_many_pairs_with_rate_and_time_left():
    lines = []
    progress = Progress(10_000, "encoding train", lines.append, every=4_000, terminal=False)
    for _ in range(10):
        progress.update(1_000)
    progress.close()
    assert len(lines) == 2  # at 4,000 and 8,000 pairs
    assert lines[0].startswith("encoding train: 4,000 of 10,000 pairs (40%), ") and "pairs/s" in lines[0]
    assert lines[1].startswith("encoding train: 8,000 of 10,000 pairs (80%)") and lines[1].endswith("min left")
