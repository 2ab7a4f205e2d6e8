"""`ChoiceText` on byte tokens: a stream's pieces never hold half a character or the start of
a stop string that may still come, and they join to the whole text."""

from __future__ import annotations

from whitney.local.openai_decode import ChoiceText
from whitney.tokenizers import ByteTokenizer

EOS = 257


def pieces(tokens: list[int], stops: tuple[str, ...], end: str | None = "length") -> list[str]:
    """The texts of the pieces sampling `tokens` lets go (the last one ending the choice)."""
    choice = ChoiceText(0, ByteTokenizer(), stops, frozenset({EOS}))
    sent: list[str] = []
    covered: list[int] = []
    for k, token in enumerate(tokens):
        piece = choice.add(token, -1.0, [], end if k == len(tokens) - 1 else None)
        if piece is not None:
            sent.append(piece.text)
            covered += piece.tokens
        if choice.finish_reason is not None:
            break
    assert "".join(sent) == choice.text and covered == choice.tokens
    return sent


def test_a_character_split_over_tokens_is_sent_whole() -> None:
    assert pieces(list("aé!".encode()), ()) == ["a", "é", "!"]


def test_what_may_begin_a_stop_string_waits_and_the_stop_string_ends_the_text() -> None:
    assert pieces(list(b"ab\nx\n\nyz"), ("\n\n",)) == ["a", "b", "\nx", ""]
    assert pieces(list(b"ab\n"), ("\n\n",)) == ["a", "b", "\n"]  # the end lets it go


def test_a_stop_token_ends_the_choice_and_is_left_out() -> None:
    choice = ChoiceText(0, ByteTokenizer(), (), frozenset({EOS}))
    assert choice.add(ord("a"), -1.0, [], None).text == "a"
    last = choice.add(EOS, -2.0, [], "stop")
    assert (last.text, last.tokens, last.finish_reason) == ("", [], "stop")
    assert (choice.text, choice.tokens, choice.logprobs) == ("a", [ord("a")], [-1.0])
