import pytest

from compassplay.rewards.reference_set import ReferenceFormatError, load_reference


def test_shipped_reference_has_32_items():
    items = load_reference()
    assert len(items) == 32
    assert all(i.prompt and i.solution for i in items)
    assert len(load_reference(max_items=4)) == 4


def test_custom_file_and_errors_name_file_and_line(tmp_path):
    good = tmp_path / "ref.jsonl"
    good.write_text('{"prompt": "1+1?", "solution": "2"}\n\n{"prompt": "2+2?", "solution": "4"}\n')
    assert [i.solution for i in load_reference(good)] == ["2", "4"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1?", "solution": "2"}\n{"prompt": "x"}\n')
    with pytest.raises(ReferenceFormatError, match=r"bad.jsonl:2: field 'solution'"):
        load_reference(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(ReferenceFormatError, match=r"broken.jsonl:1: not valid JSON"):
        load_reference(broken)
    with pytest.raises(ReferenceFormatError, match="not found"):
        load_reference(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ReferenceFormatError, match="empty"):
        load_reference(empty)


def test_the_paper_configs_use_the_shipped_32_math_problems():
    from compassplay.config import load_config

    for name in ("paper_coding_7b", "baseline_difficulty_7b", "baseline_soar_7b"):
        items = load_reference(load_config(name).reference.path)
        assert len(items) == 32 and all("\\boxed" in it.solution for it in items)
