"""The hang watch's saved record: what its readers load instead of scraping its output."""


from __future__ import annotations

from workshop_lib.debug import hangreport

BLOCK = ["rank 0 has waited 4 s in all_reduce #3 (float32[1]), called at a.py:9 in train()",
         "never arrived: rank 1",
         "rank 1 is in all_gather #3 (2 tensors, first float32[8]) at a.py:5 in spread(), not in all_reduce #3: the "
         "ranks called different collectives"]


def test_the_saved_record_names_who_is_waited_for(tmp_path):
    path = tmp_path / "hang.json"
    assert hangreport.load(path) == [] and hangreport.missing_rank(path) is None
    hangreport.save(path, 0, BLOCK, left=[1])  # rank 1 has left: not a lasting hang
    assert hangreport.missing_rank(path) is None
    hangreport.save(path, 0, BLOCK)
    saved = hangreport.load(path)
    assert [b["missing"] for b in saved] == [[1], [1]] and saved[1]["waiting_for"] == [1]
    assert hangreport.missing_rank(path) == hangreport.one_line(BLOCK)
    assert hangreport.missing_rank(path).startswith("rank 0 waits in all_reduce #3 (called at a.py:9 in train()); "
                                                    "rank 1 never joined it: it is in all_gather #3")
    assert not list(tmp_path.glob(".hang.json.*"))  # no temporary file left behind


def test_the_record_keeps_what_each_rank_answered(tmp_path):
    """The ranks' own answers (frames, collectives) go into the record too: figures and checks read them."""
    path = tmp_path / "hang.json"
    answers = {1: {"rank": 1, "frames": [["a.py", 5, "spread", "dist.all_gather(xs, x)"]], "history": []},
               0: {"rank": 0, "frames": [], "history": []}}
    hangreport.save(path, 0, BLOCK, answers=answers)
    saved = hangreport.load(path)[0]["answers"]
    assert list(saved) == ["0", "1"] and saved["1"]["frames"][0][1] == 5  # JSON keys: the ranks as text
