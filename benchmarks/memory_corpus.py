"""A fixed corpus of a user's memories and questions about them, written in other words.

``ANSWERS`` are 20 facts a personal assistant was told; ``QUESTIONS`` ask for each one in
other words, sharing with its answer only a word or two that matter (no synonyms needed)
and many common words ("my", "what", "the", "is") with everything else. ``DISTRACTORS``
are 200 other memories built from fixed lists, full of those common words and of some of
the questions' words in other contexts. The quality test wants each answer in the top 3;
the memory benchmark reports the top-3 hit rate of every service on this corpus.
"""

from __future__ import annotations

import itertools

__all__ = ["ANSWERS", "CORPUS", "DISTRACTORS", "QUESTIONS"]

ANSWERS = [
    "My sister Clara moved to Lyon last spring and works there as a nurse.",
    "The wifi password at the cabin is bluefinch42.",
    "I am allergic to peanuts, so always check the labels for me.",
    "Our dentist appointment is on the fourth of March at 9 in the morning.",
    "My passport expires in November 2027.",
    "The dog's name is Biscuit and he is a beagle.",
    "I prefer aisle seats on long flights.",
    "My manager is Priya Raman and she runs the platform team.",
    "The spare house key is hidden under the blue flowerpot by the back door.",
    "My blood type is O negative.",
    "We are saving for a kitchen renovation with a budget of 18000 euros.",
    "My favourite author is Ursula Le Guin, especially The Dispossessed.",
    "The car is a grey 2019 Skoda Octavia, plate KX19 PLT.",
    "I run the Berlin marathon every September.",
    "My mother's birthday is on the twelfth of July.",
    "The gym membership renews automatically on the first of every month.",
    "I take levothyroxine every morning before breakfast.",
    "Our landlord is Mr Okafor and his number is in the building chat.",
    "I speak Portuguese fluently and some basic Japanese.",
    "The printer in the study uses HP 305 ink cartridges.",
]

QUESTIONS = [
    "What city is Clara in?",
    "What do I type to get online at the cabin?",
    "Is there any food I am allergic to?",
    "When do we see the dentist?",
    "Until when is my passport valid?",
    "What is our beagle called?",
    "What kind of seats should you book on my flights?",
    "Who is my manager these days?",
    "Where can I find the spare key if I am locked out?",
    "What is my blood group?",
    "How much can we spend on the kitchen?",
    "Which author do I like the most?",
    "What is the plate number of the Skoda?",
    "Which marathon do I do each year?",
    "When should I call my mother for her birthday?",
    "When does the gym charge me?",
    "What medication do I take in the morning?",
    "What is the landlord called?",
    "Which languages can I speak?",
    "What cartridges does the printer need?",
]

_WHEN = ["On Monday", "Last week", "Yesterday", "This morning", "In the evening"]
_DID = [
    "I had coffee with", "we went hiking with", "I called", "I helped", "we cooked dinner for",
    "I wrote an email to", "I played tennis with", "we watched a film with",
]  # fmt: skip
_WHO = ["Tom", "my neighbour", "the team", "my cousin", "an old friend"]
_WHERE = [
    "and it was a good day.", "at the new place in town.", "and we talked about work.",
    "before the meeting in the city.", "and the weather was great.",
]  # fmt: skip
_ASK = [
    "What is the", "Where is my", "When is the", "How do I fix the", "Who has my",
    "Which is the best",
]  # fmt: skip
_THING = [
    "umbrella", "phone charger", "recipe for soup", "bus timetable", "gift for the party",
    "form for the tax office", "TV remote", "receipt for the shoes", "plan for the trip",
    "number of the plumber",
]  # fmt: skip
_TAIL = ["in the drawer?", "for this week?", "I keep losing it.", "I need it today."]
_NOTES = [
    "What is the plan for the weekend? Maybe a walk in the park.",
    "The meeting notes are in the shared folder of the team.",
    "Remember to water the plants on the balcony.",
    "The train to work was late again this morning.",
    "I should read more books this year.",
    "My phone needs a new case, the old one is broken.",
    "We need milk, eggs and bread from the shop.",
    "The new season of the show starts in the autumn.",
    "Is it better to book the hotel now or wait?",
    "My laptop battery does not last a full day any more.",
    "The kids have a school trip to the museum on Friday.",
    "I want to learn to play the guitar properly.",
    "The bank sent a letter about the new card.",
    "The bike needs new brakes before the summer.",
    "My key ring has too many old keys on it.",
    "The city library is closed on Sundays.",
    "What a long day, I am going to bed early.",
    "The plane tickets for the holiday were cheap this time.",
    "I do not like the new layout of the app.",
    "My brother called about the family dinner.",
]


def _every(n: int, *lists: list[str]) -> list[tuple[str, ...]]:
    """``n`` combinations of the lists, spread evenly over all of them."""
    combos = list(itertools.product(*lists))
    step = len(combos) / n
    return [combos[int(i * step)] for i in range(n)]


DISTRACTORS = (
    [" ".join(parts) for parts in _every(100, _WHEN, _DID, _WHO, _WHERE)]
    + [" ".join(parts) for parts in _every(80, _ASK, _THING, _TAIL)]
    + _NOTES
)
"""200 memories that answer none of the questions."""

CORPUS = DISTRACTORS + ANSWERS
"""Every memory of the user, the answers added last."""

assert len(DISTRACTORS) == 200, len(DISTRACTORS)
assert len(QUESTIONS) == len(ANSWERS) == 20
