"""Text helpers shared by search and reward: the search analyzer and a part-of-speech heuristic for nouns.

Search analyzer
---------------
The original WebShop indexes with Lucene's default English analyzer (via pyserini): lower-case, split on
non-alphanumerics, drop Lucene's 33 English stop words, Porter-stem. We keep the same stop list and splitting and use
the *S-stemmer* (Harman 1991, Lucene's ``EnglishMinimalStemmer``: plurals only) instead of Porter. It needs no
package, and on product text (nouns in the plural: ``shoes``, ``batteries``) it merges the forms that matter; it does
not merge verb/adjective forms (``washable`` / ``wash``) the way Porter does.

Nouns without spaCy
-------------------
The original's type reward keeps the tokens that spaCy's ``en_core_web_lg`` tags ``NOUN`` / ``PROPN``. We cannot ship
a 500 MB model, so :func:`nouns` uses a lexicon-and-suffix heuristic: a token is a noun unless it is a number, a
function word, a known adjective / verb / adverb, or has an adjective or adverb suffix. On product titles (mostly noun
compounds and brand names, which spaCy tags PROPN) this agrees with spaCy on the tokens that decide the score; it
differs on rare words used as adjectives that our lists do not know (we call them nouns) -- see ``docs/webshop.md``.
"""

from __future__ import annotations

import re

#: Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` (what pyserini's default analyzer drops).
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split()
)

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)


def s_stem(word: str) -> str:
    """Harman's S-stemmer: ``ies`` -> ``y``, ``es`` -> ``e``, ``s`` -> ``""`` with the usual exceptions."""
    n = len(word)
    if n < 3 or word[-1] != "s":
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def analyze(text: str) -> list[str]:
    """Lower-case, split on anything but letters and digits, drop stop words, S-stem. Never raises."""
    out = []
    for token in _WORD_RE.findall(text.lower()):
        if token in LUCENE_STOPWORDS or len(token) > 64:
            continue
        out.append(s_stem(token))
    return out


# ----------------------------------------------------------------------------------------------- noun heuristic
_FUNCTION_WORDS = frozenset(
    """a an the and or nor but so yet for of in on at by with without within from to into onto upon over under
    above below between among through during before after about against along across around behind beyond near
    off out up down per via than as like unlike plus minus
    i me my mine we us our ours you your yours he him his she her hers it its they them their theirs this that
    these those who whom whose which what where when why how all any both each every either neither some such
    no not only own same other another more most less least few many much several enough very too also just
    is are was were be been being am do does did have has had can could will would shall should may might must
    one two three four five six seven eight nine ten eleven twelve dozen half""".split()
)

#: Adjectives common in product titles (spaCy tags these ADJ in most contexts).
_ADJECTIVES = frozenset(
    """new old small large big little tiny huge mini long short tall high low wide narrow thin thick heavy light
    soft hard smooth rough warm cold cool hot dry wet fresh clean natural organic pure premium classic modern
    vintage retro casual formal elegant cute pretty beautiful comfortable comfy durable sturdy strong portable
    compact lightweight waterproof water-resistant adjustable foldable reusable rechargeable wireless cordless
    digital electric electronic automatic manual smart universal professional personal perfect best better great
    good fine extra super ultra slim loose tight flat round square oval curved straight full double single triple
    multi multiple various assorted mixed solid plain striped floral printed graphic fashionable stylish sexy
    black white red blue green yellow orange purple pink brown grey gray silver golden beige navy ivory teal
    khaki maroon olive tan cream dark bright pale deep clear transparent matte glossy shiny metallic
    sugar-free gluten-free non-gmo vegan kosher keto healthy delicious tasty sweet sour salty spicy savory crunchy
    chewy creamy rich mild strong bold decaf caffeinated roasted unsalted salted dried frozen raw whole
    anti non easy quick fast slow quiet loud safe secure ergonomic stainless hypoallergenic cruelty-free
    long-lasting non-slip anti-slip breathable moisture-wicking quick-dry wrinkle-free stretchy elastic
    indoor outdoor upholstered tufted wooden faux genuine real""".split()
)

#: Verbs and participles common in titles.
_VERBS = frozenset(
    """make made use used fits fitted wash washed washable dry dried care cleaning clean set sets get keep
    hold holds holding support supports supporting protect protects protecting include includes including
    design designed feature features featuring charge charging charged print printed style styled pack packed
    sealed brewed baked cooked ground""".split()
)

_ADJ_SUFFIXES = ("ous", "ful", "able", "ible", "ive", "less", "ish", "ic", "ical", "est")
_ADV_SUFFIX = "ly"
_NOUN_EXCEPTIONS = frozenset(
    """family supply supplies jelly belly assembly body poly rally trolley pulley lily bully doily panty
    butterfly fly dolly rugby rally ally anthology melody remedy comedy""".split()
)


def is_noun(token: str) -> bool:
    """Whether a lower-case token would be tagged NOUN or PROPN (heuristic; see the module docstring)."""
    if not token or not any(c.isalpha() for c in token):
        return False  # numbers and symbols: spaCy tags NUM / PUNCT / SYM
    if token in _FUNCTION_WORDS or token in _ADJECTIVES or token in _VERBS:
        return False
    if token in _NOUN_EXCEPTIONS:
        return True
    if len(token) > 4 and token.endswith(_ADV_SUFFIX):
        return False
    if len(token) > 5 and token.endswith(_ADJ_SUFFIXES):
        return False
    if len(token) > 4 and token.endswith("ed") and not token.endswith(("eed", "bed", "shed")):
        return False  # past participles used as adjectives: "padded", "quilted"
    if len(token) > 5 and token.endswith("ing") and not token.endswith(("ring", "thing", "ding", "ling")):
        return False  # gerunds used as modifiers: "running shoes"
    return True


# spaCy-like tokens: dotted abbreviations stay whole ("D.o.n."), hyphens and slashes split ("Unisex-Adult"),
# a possessive is split off below ("men's" -> "men").
_TITLE_TOKEN_RE = re.compile(r"[A-Za-z0-9]+(?:\.[A-Za-z0-9]+)+\.?|[A-Za-z0-9]+(?:'[A-Za-z]+)?")


def nouns(title: str) -> list[str]:
    """The lower-cased noun tokens of ``title`` in order (duplicates kept, like the original's list)."""
    tokens = (m.lower() for m in _TITLE_TOKEN_RE.findall(title))
    # spaCy splits a possessive off ("Women's" -> "Women" NOUN + "'s" PART): keep the noun.
    tokens = (t[:-2] if t.endswith("'s") else t for t in tokens)
    return [t for t in tokens if is_noun(t)]
