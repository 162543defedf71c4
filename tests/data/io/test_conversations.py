"""Instruction data into rows: YAML conversations (the chatterbot-corpus layout), a JSONL messages field and
prompt/completion columns all become one encoded conversation per row; bad ones are one line naming the file
and the place; clean cleans message by message and keeps the roles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import CleanConfig, SourceConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.io import conversation
from pipeline.data.stages import clean, load

YAML = """categories:
- Science
- physics
conversations:
- - What is a quark?
  - An elementary particle.
- - Hello
  - Hi there
  - How are you?
  - Fine, thanks.
- "a string, not a list of turns"
"""


def _read(path: Path, **source):
    cfg = SourceConfig(path=str(path), **source)
    return load.read_source(path, cfg, str(path))


def test_encode_and_decode_round_trip_and_marks_never_reach_a_content():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q\x1e?"},
            {"role": "assistant", "content": "A."}]
    text = conversation.encode(msgs)
    assert conversation.decode(text) == [msgs[0], {"role": "user", "content": "Q?"}, msgs[2]]
    assert conversation.plain(text) == "Be brief.\nQ?\nA."
    with pytest.raises(ValueError, match="^message 1 has role 'bot'; roles are system, user, assistant$"):
        conversation.encode([{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}])
    with pytest.raises(ValueError, match="^the conversation has no assistant message to learn from$"):
        conversation.encode([{"role": "user", "content": "q"}])
    # passed load and failed 65 s later in tokenize ("Cannot apply chat template to an empty conversation"), no file
    for opening in ([{"role": "assistant", "content": "a"}],
                    [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"},
                     {"role": "assistant", "content": "a"}]):
        with pytest.raises(ValueError, match="^message 0 is the assistant's: a conversation opens with a system or "
                                             "user message, the prompt its first answer follows$"):
            conversation.encode(opening)
    assert conversation.decode(conversation.encode([{"role": "system", "content": "s"},
                                                    {"role": "assistant", "content": "a"}]))[1]["content"] == "a"


def test_yaml_conversations_become_rows_labelled_by_category_and_a_bad_one_is_named(tmp_path):
    (tmp_path / "science.yml").write_text(YAML, encoding="utf-8")
    where = f"{tmp_path / 'science.yml'}: conversations\\[2\\]"
    with pytest.raises(ValueError, match=rf"^{where}: a conversation is a list of at least two turns .*; fix it or "
                                         rf"set source.bad_lines=skip$"):
        _read(tmp_path, format="conversations", glob="*.yml", label_field="categories")
    ds, dropped, rows_read = _read(tmp_path, format="conversations", glob="*.yml", label_field="categories",
                                   bad_lines="skip")
    assert rows_read == 2 and dropped["bad_line"] == 1 and ds["label"][:] == ["Science", "Science"]
    second = conversation.decode(ds["text"][1])
    assert [m["role"] for m in second] == ["user", "assistant", "user", "assistant"]
    assert second[3]["content"] == "Fine, thanks."
    with pytest.raises(ValueError, match="no top-level key 'topic' \\(source.label_field\\); keys: categories, "
                                         "conversations$"):
        _read(tmp_path, format="conversations", glob="*.yml", label_field="topic", bad_lines="skip")


def test_a_jsonl_messages_field_and_prompt_completion_columns_become_conversations(tmp_path):
    f = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "id": "a"},
            {"messages": [{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "yo"}], "id": "b"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ds, _, _ = _read(f, format="jsonl", messages_field="messages", label_field="", id_field="id")
    assert [conversation.decode(t) for t in ds["text"][:]] == [r["messages"] for r in rows]
    lone = json.dumps({"messages": [{"role": "assistant", "content": "only an answer"}], "id": "d"}) + "\n"
    f.write_text(f.read_text() + lone, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{f}:3: field 'messages': message 0 is the assistant's: .*; fix the line or "
                                         rf"set source.bad_lines=skip$"):
        _read(f, format="jsonl", messages_field="messages", label_field="", id_field="id")
    ds, dropped, _ = _read(f, format="jsonl", messages_field="messages", label_field="", id_field="id",
                           bad_lines="skip")
    assert ds.num_rows == 2 and dropped["bad_line"] == 1
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    f.write_text(f.read_text() + json.dumps({"messages": [{"role": "user"}], "id": "c"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{f}:3: field 'messages': message 0 is not an object with 'role' and "
                                         rf"'content'; fix the line or set source.bad_lines=skip$"):
        _read(f, format="jsonl", messages_field="messages", label_field="", id_field="id")
    j = tmp_path / "chat.csv"
    j.write_text('id,msgs\na,"[{""role"": ""user"", ""content"": ""hi""}, {""role"": ""assistant"", ""content"": ""yo""}]"\n'
                 'b,not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{j}: row 2, field 'msgs' \(source.messages_field\): not a JSON list of "
                                         rf"messages \(Expecting value at column 1\)$"):
        _read(j, format="csv", messages_field="msgs", label_field="", id_field="id")
    j.write_text(j.read_text().splitlines()[0] + "\n" + j.read_text().splitlines()[1] + "\n", encoding="utf-8")
    ds, _, _ = _read(j, format="csv", messages_field="msgs", label_field="", id_field="id")
    assert conversation.decode(ds["text"][0]) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"messages": [r["messages"] for r in rows], "id": ["a", "b"]}), tmp_path / "chat.parquet")
    ds, _, _ = _read(tmp_path / "chat.parquet", format="parquet", messages_field="messages", label_field="", id_field="id")
    assert [conversation.decode(t) for t in ds["text"][:]] == [r["messages"] for r in rows]
    c = tmp_path / "pairs.csv"
    c.write_text("question,answer\nWhat is 1+1?,Two.\n,orphan\nCapital of France?,Paris.\n", encoding="utf-8")
    ds, dropped, _ = _read(c, format="csv", prompt_field="question", text_field="answer", label_field="")
    assert [conversation.decode(t) for t in ds["text"][:]] == [
        [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "Two."}],
        [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]]
    assert dropped["empty"] == 1  # a pair without its prompt is no example


def test_clean_cleans_each_message_and_drops_a_conversation_with_an_empty_one(tmp_path):
    from datasets import Dataset

    texts = [conversation.encode([{"role": "user", "content": "<b>Hi</b>  there"},
                                  {"role": "assistant", "content": "Hello &amp; welcome\n\n\nfriend"}]),
             conversation.encode([{"role": "user", "content": "<br>"}, {"role": "assistant", "content": "ok"}])]
    ds = Dataset.from_dict({"id": ["a", "b"], "text": texts, "label": ["", ""], "source_split": ["", ""]})
    r = clean.clean(ds, CleanConfig(keep_lines=True),
                    StageContext(out_dir=tmp_path, progress=False, conversations=True))
    assert r.dropped == {"empty_message": 1}
    assert conversation.decode(r.data["text"][0]) == [{"role": "user", "content": "Hi there"},
                                                       {"role": "assistant", "content": "Hello & welcome\n\nfriend"}]


def test_a_yaml_alias_bomb_is_one_line_naming_the_line_and_bad_yaml_too(tmp_path):
    bomb = tmp_path / "bomb.yml"
    bomb.write_text("a: &a [q, r]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nconversations: [*b, *b, *b, *b]\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{bomb}:2: not valid YAML \(an alias \(\*name\): conversation files may "
                                         rf"not repeat nodes by reference\)$"):
        _read(bomb, format="conversations")
    broken = tmp_path / "broken.yml"
    broken.write_text("conversations:\n- - q\n  - [unclosed\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{broken}:4: not valid YAML \("):
        _read(broken, format="conversations")
    plain = tmp_path / "list.yml"
    plain.write_text("- - q\n  - a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{plain}: expected a mapping with a `conversations:` list"):
        _read(plain, format="conversations")


def test_a_file_nested_past_the_recursion_limit_is_one_line_naming_it(tmp_path):
    """A conversations YAML nested 20,000 deep was a 3,000-line RecursionError; so was such a JSONL line."""
    deep = tmp_path / "deep.yml"
    deep.write_text("conversations:\n- " + "[" * 20000 + "]" * 20000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{deep}: not valid YAML \(nested too deeply to read: past Python's "
                                         r"recursion limit\)"):
        _read(tmp_path, format="conversations", glob="deep.yml", label_field="")
    lines = tmp_path / "deep.jsonl"
    lines.write_text(json.dumps({"text": "fine"}) + "\n" + '{"text": ' + "[" * 100000 + "]" * 100000 + "}\n",
                     encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{lines}:2: JSON nested too deeply to read \(past Python's recursion "
                                         r"limit\); fix the line or set source.bad_lines=skip$"):
        _read(lines, format="jsonl", label_field="")
    ds, dropped, _ = _read(lines, format="jsonl", label_field="", bad_lines="skip")
    assert ds["text"][:] == ["fine"] and dropped["bad_line"] == 1


def test_a_lone_surrogate_escape_in_a_conversation_becomes_u_fffd_as_in_jsonl(tmp_path):
    """`"\\ud83d"` (half a character) reached Arrow's UTF-8 writer and failed with no file named; JSONL's reader
    already stored it as U+FFFD, as a decoder does a bad byte."""
    (tmp_path / "a.yml").write_text('categories: ["x\\udc00"]\nconversations:\n- - "hi \\ud83d"\n  - "yo"\n',
                                    encoding="utf-8")
    ds, _, _ = _read(tmp_path, format="conversations", glob="*.yml", label_field="categories")
    assert conversation.decode(ds["text"][0])[0]["content"] == "hi \ufffd" and ds["label"][:] == ["x\ufffd"]
