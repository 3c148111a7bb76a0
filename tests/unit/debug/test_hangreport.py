"""The hang watch's saved record: what its readers load instead of scraping its output."""


from __future__ import annotations

from workshop_lib.debug import hangreport

STUCK = {"kind": "collective", "name": "all_reduce", "seq": 3, "n": 3, "tensors": "float32[1]", "t": 0.0,
         "where": "a.py:9 in train()"}
GATHER = {**STUCK, "name": "all_gather", "n": 1, "tensors": "2 tensors, first float32[8]", "where": "a.py:5 in spread()"}
ANSWERS = {1: {"rank": 1, "frames": [["a.py", 5, "spread", "dist.all_gather(xs, x)"]], "inner": "all_gather",
               "current": GATHER, "last": GATHER, "history": [GATHER]},
           0: {"rank": 0, "frames": [], "inner": "", "current": STUCK, "last": STUCK, "history": [STUCK]}}
REPORT = hangreport.explain(0, STUCK, "has waited 4 s", ANSWERS, 2)


def test_the_saved_record_names_who_is_waited_for(tmp_path):
    path = tmp_path / "hang.json"
    assert hangreport.load(path) == [] and hangreport.missing_rank(path) is None
    hangreport.save(path, REPORT, left=[1])  # rank 1 has left: not a lasting hang
    assert hangreport.missing_rank(path) is None
    hangreport.save(path, REPORT)
    saved = hangreport.load(path)
    assert [b["missing"] for b in saved] == [[1], [1]] and saved[1]["waiting_for"] == [1]
    assert saved[1]["block"] == REPORT["block"] and hangreport.missing_rank(path) == REPORT["line"] == (
        "rank 0 waits in all_reduce #3 (called at a.py:9 in train()); rank 1 never joined it: it is in all_gather #3 "
        "(2 tensors, first float32[8]) at a.py:5 in spread()")
    assert not list(tmp_path.glob(".hang.json.*"))  # no temporary file left behind


def test_the_record_keeps_what_each_rank_answered(tmp_path):
    """The ranks' own answers (frames, collectives) go into the record too: figures and checks read them."""
    path = tmp_path / "hang.json"
    hangreport.save(path, REPORT, answers=ANSWERS)
    saved = hangreport.load(path)[0]["answers"]
    assert list(saved) == ["0", "1"] and saved["1"]["frames"][0][1] == 5  # JSON keys: the ranks as text
