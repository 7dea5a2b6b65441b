"""The demo model's training corpus (scripts/train_demo_model.py): English chats generated from
templates and word lists written for this script, rendered as ChatML.

    build_corpus(num_conversations, seed) -> rendered conversations (demo_chatml.render)
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_chatml import render  # noqa: E402 (this folder, put on the path above)
from demo_words import (  # noqa: E402
    ABILITIES,
    ABILITY_Q,
    ADJS,
    ANIMALS,
    BYE_A,
    BYE_Q,
    COLOR_FACTS,
    COLOR_MIX,
    DAYS,
    ENDINGS,
    FEELING_A,
    FEELING_Q,
    GREETING_REPLIES,
    GREETINGS,
    HOW_ARE_YOU_A,
    HOW_ARE_YOU_Q,
    JOKES,
    MONTHS,
    NAME_Q,
    NOUNS,
    NUMBER_WORDS,
    OPPOSITES,
    PLACES,
    SEASONS,
    SELF_INTRO,
    STATEMENT_A,
    STORY_FRIENDS,
    STORY_OBJECTS,
    STORY_PLACES,
    SUBJECTS,
    SYSTEM_PROMPTS,
    THANKS_A,
    THANKS_Q,
    THINGS,
    UNKNOWN_A,
    UNKNOWN_OTHER_Q,
    UNKNOWN_Q,
    UNKNOWN_TOPICS,
    VERBS,
    cap,
    plural,
    with_article,
)


def _animal_qa(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(list(ANIMALS))
    art, size, kind, home, food, sound, color, legs, extra = ANIMALS[name]
    an = f"{art} {name}"
    kind_art = "an" if kind[0] in "aeiou" else "a"
    size_art = "an" if size[0] in "aeiou" else "a"
    pick = rng.randrange(9)
    if pick == 0:
        q = rng.choice([f"What is {an}?", f"Tell me about {an}.", f"What is {an} like?",
                        f"Can you tell me about the {name}?", f"Describe {an}."])
        a = f"{cap(an)} is {size_art} {size} {kind}. It lives {home} and eats {food}. {extra}"
    elif pick == 1:
        q = rng.choice([f"What sound does {an} make?", f"What does {an} say?",
                        f"What noise does {an} make?"])
        if sound.startswith("no sound") or sound.startswith("a "):
            a = f"{cap(an)} makes {sound}."
        else:
            a = f"{cap(an)} says {sound}!"
    elif pick == 2:
        q = rng.choice([f"How many legs does {an} have?", f"How many legs has {an} got?"])
        a = f"{cap(an)} has no legs." if legs == "no" else f"{cap(an)} has {legs} legs."
    elif pick == 3:
        q = rng.choice([f"Where does {an} live?", f"Where do {plural(name)} live?"])
        a = f"{cap(an)} lives {home}."
    elif pick == 4:
        q = rng.choice([f"What does {an} eat?", f"What do {plural(name)} eat?"])
        a = f"{cap(an)} eats {food}."
    elif pick == 5:
        q = rng.choice([f"What color is {an}?", f"What color are {plural(name)}?"])
        a = f"{cap(an)} is usually {color}." if "many" not in color else f"{cap(an)} can be {color}."
    elif pick == 6:
        q = rng.choice([f"Is {an} a {kind}?", f"What kind of animal is {an}?",
                        f"What type of animal is the {name}?"])
        a = f"{cap(an)} is {kind_art} {kind}. {extra}"
    elif pick == 7:
        q = rng.choice([f"Tell me a fact about {an}.", f"Tell me something about {an}.",
                        f"Give me a fun fact about the {name}."])
        a = extra.replace("It ", f"{cap(an)} ", 1) if extra.startswith("It ") else extra
    else:
        q = rng.choice(["Name an animal.", "Can you name an animal?", "Tell me an animal.",
                        "What is your favorite animal?"])
        if q.startswith("What is your"):
            a = f"I like the {name}. {cap(an)} is {size_art} {size} {kind}. {extra}"
        else:
            a = f"{cap(an)}. {cap(an)} is {size_art} {size} {kind} that lives {home}."
    return q, a


def _thing_qa(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(list(THINGS))
    art, desc, color = THINGS[name]
    thing = with_article(name, art)
    pick = rng.randrange(3)
    if pick == 0:
        q = rng.choice([f"What is {thing}?", f"Tell me about {thing}.", f"What is {thing}?",
                        f"Can you tell me what {thing} is?", f"Explain what {thing} is."])
        a = f"{cap(thing)} is {desc}."
    elif pick == 1:
        q = f"What color is {thing}?"
        a = f"{cap(thing)} is {color}." if "many" not in color and "any" not in color else f"{cap(thing)} can be {color}."
        if color == "no color":
            a = f"{cap(name)} has no color. It is something you hear."
    else:
        q = f"Do you know what {thing} is?"
        a = f"Yes! {cap(thing)} is {desc}."
    return q, a


def _color_qa(rng: random.Random) -> tuple[str, str]:
    pick = rng.randrange(4)
    if pick == 0:
        color = rng.choice(list(COLOR_FACTS))
        items = rng.sample(COLOR_FACTS[color], k=min(2, len(COLOR_FACTS[color])))
        q = rng.choice([f"Name something that is {color}.", f"What things are {color}?",
                        f"Tell me something {color}.", f"What is {color}?"])
        a = f"{cap(items[0])} is {color}. {cap(items[1])} is {color} too."
    elif pick == 1:
        (c1, c2), mix = rng.choice(list(COLOR_MIX.items()))
        if rng.random() < 0.5:
            c1, c2 = c2, c1
        q = rng.choice([f"What do you get when you mix {c1} and {c2}?",
                        f"What color do {c1} and {c2} make?", f"If I mix {c1} and {c2}, what color do I get?"])
        a = f"{cap(c1)} and {c2} make {mix}."
    elif pick == 2:
        q = rng.choice(["What is your favorite color?", "Do you have a favorite color?"])
        color = rng.choice(list(COLOR_FACTS))
        a = f"I like {color}, because {COLOR_FACTS[color][0]} is {color}."
    else:
        q = rng.choice(["What colors are in a rainbow?", "Name the colors of the rainbow.",
                        "How many colors are in a rainbow?"])
        a = "A rainbow has seven colors: red, orange, yellow, green, blue, indigo and violet."
    return q, a


def _num(n: int, rng: random.Random, words: bool) -> str:
    return NUMBER_WORDS[n] if words else str(n)


def _number_qa(rng: random.Random) -> tuple[str, str]:
    pick = rng.randrange(6)
    words = rng.random() < 0.4
    if pick in (0, 1):
        x = rng.randint(0, 10)  # small sums (at most ten): few enough facts to learn quickly
        y = rng.randint(0, 10 - x)
        xs, ys, zs = _num(x, rng, words), _num(y, rng, words), _num(x + y, rng, words)
        q = rng.choice([f"What is {xs} plus {ys}?", f"What is {xs} + {ys}?",
                        f"How much is {xs} plus {ys}?", f"Add {xs} and {ys}."])
        a = f"{cap(xs)} plus {ys} is {zs}."
    elif pick == 2:
        x = rng.randint(0, 10)
        y = rng.randint(0, x)
        xs, ys, zs = _num(x, rng, words), _num(y, rng, words), _num(x - y, rng, words)
        q = rng.choice([f"What is {xs} minus {ys}?", f"What is {xs} - {ys}?",
                        f"Take {ys} away from {xs}."])
        a = f"{cap(xs)} minus {ys} is {zs}."
    elif pick == 3:
        n = rng.randint(3, 10)
        q = rng.choice([f"Count to {_num(n, rng, words)}.", f"Can you count to {_num(n, rng, words)}?",
                        f"Count from one to {_num(n, rng, words)}."])
        seq = [NUMBER_WORDS[i] for i in range(1, n + 1)] if rng.random() < 0.6 else [str(i) for i in range(1, n + 1)]
        a = cap(", ".join(seq)) + "."
    elif pick == 4:
        n = rng.randint(0, 19)
        if rng.random() < 0.5:
            q = rng.choice([f"What number comes after {_num(n, rng, words)}?",
                            f"What comes after {_num(n, rng, words)}?"])
            a = f"{cap(_num(n + 1, rng, words))} comes after {_num(n, rng, words)}."
        else:
            n += 1
            q = rng.choice([f"What number comes before {_num(n, rng, words)}?",
                            f"What comes before {_num(n, rng, words)}?"])
            a = f"{cap(_num(n - 1, rng, words))} comes before {_num(n, rng, words)}."
    else:
        n = rng.randint(0, 20)
        if rng.random() < 0.5:
            q = rng.choice([f"Is {n} even or odd?", f"Is {NUMBER_WORDS[n]} an even number?"])
            a = f"{cap(NUMBER_WORDS[n])} is {'even' if n % 2 == 0 else 'odd'}."
        else:
            q = rng.choice([f"How do you write {n} in words?", f"Spell the number {n}."])
            a = f"The number {n} is written {NUMBER_WORDS[n]}."
    return q, a


def _calendar_qa(rng: random.Random) -> tuple[str, str]:
    pick = rng.randrange(8)
    if pick == 0:
        i = rng.randrange(7)
        q = rng.choice([f"What day comes after {DAYS[i]}?", f"What is the day after {DAYS[i]}?",
                        f"If today is {DAYS[i]}, what day is tomorrow?"])
        a = f"{DAYS[(i + 1) % 7]} comes after {DAYS[i]}." if not q.startswith("If") else f"Tomorrow is {DAYS[(i + 1) % 7]}."
    elif pick == 1:
        i = rng.randrange(7)
        q = rng.choice([f"What day comes before {DAYS[i]}?", f"If today is {DAYS[i]}, what day was yesterday?"])
        a = f"{DAYS[i - 1]} comes before {DAYS[i]}." if not q.startswith("If") else f"Yesterday was {DAYS[i - 1]}."
    elif pick == 2:
        q = rng.choice(["How many days are in a week?", "How many days does a week have?",
                        "What are the days of the week?", "Name the days of the week."])
        a = "There are seven days in a week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday."
    elif pick == 3:
        q = rng.choice(["What days are the weekend?", "Which days are the weekend?"])
        a = "The weekend is Saturday and Sunday."
    elif pick == 4:
        i = rng.randrange(12)
        if rng.random() < 0.5:
            q = rng.choice([f"What month comes after {MONTHS[i]}?", f"What is the month after {MONTHS[i]}?"])
            a = f"{MONTHS[(i + 1) % 12]} comes after {MONTHS[i]}."
        else:
            q = f"What month comes before {MONTHS[i]}?"
            a = f"{MONTHS[i - 1]} comes before {MONTHS[i]}."
    elif pick == 5:
        q = rng.choice(["How many months are in a year?", "How many months does a year have?"])
        a = "There are twelve months in a year."
    elif pick == 6:
        i = rng.randrange(12)
        q = rng.choice([f"What number month is {MONTHS[i]}?", f"Which month of the year is {MONTHS[i]}?"])
        ordinal = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
                   "ninth", "tenth", "eleventh", "twelfth"][i]
        a = f"{MONTHS[i]} is the {ordinal} month of the year."
    else:
        s = rng.choice(list(SEASONS))
        before, after, weather = SEASONS[s]
        choice = rng.randrange(3)
        if choice == 0:
            q = rng.choice([f"What is {s} like?", f"What is the weather like in {s}?", f"Tell me about {s}."])
            a = f"In {s}, it is {weather}."
        elif choice == 1:
            q = f"What season comes after {s}?"
            a = f"{cap(after)} comes after {s}."
        else:
            q = rng.choice(["How many seasons are there?", "What are the four seasons?"])
            a = "There are four seasons: spring, summer, autumn and winter."
    return q, a


def _opposite_qa(rng: random.Random) -> tuple[str, str]:
    w, o = rng.choice(list(OPPOSITES.items()))
    if rng.random() < 0.5:
        w, o = o, w
    q = rng.choice([f"What is the opposite of {w}?", f"What is the opposite of the word {w}?",
                    f"Tell me the opposite of {w}."])
    return q, f"The opposite of {w} is {o}."


def _story(rng: random.Random) -> tuple[str, str]:
    animal = rng.choice(list(ANIMALS))
    art = ANIMALS[animal][0]
    size = rng.choice(["little", "young", "small", "brave", "curious", "kind"])
    obj, place, friend = rng.choice(STORY_OBJECTS), rng.choice(STORY_PLACES), rng.choice(STORY_FRIENDS)
    q = rng.choice(["Tell me a story.", "Can you tell me a short story?", "Tell me a bedtime story.",
                    f"Tell me a story about {art} {animal}.", f"Write a short story about {art} {animal}.",
                    "I want to hear a story."])
    size_art = "an" if size[0] in "aeiou" else "a"
    endings = [
        "They became best friends, and they played together every day. The end.",
        "They shared it and laughed until the sun went down. The end.",
        f"From that day on, the {animal} was never lonely again. The end.",
    ]
    a = (f"Once upon a time, there was {size_art} {size} {animal} who lived {place}. "
         f"One day, the {animal} found a {obj}. "
         f"The {animal} showed the {obj} to {friend}. " + rng.choice(endings))
    return q, a


def _joke(rng: random.Random) -> tuple[str, str]:
    q = rng.choice(["Tell me a joke.", "Do you know a joke?", "Make me laugh.", "Tell me something funny."])
    return q, rng.choice(JOKES)


def _unknown(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        q = rng.choice(UNKNOWN_Q).format(t=rng.choice(UNKNOWN_TOPICS))
    else:
        q = rng.choice(UNKNOWN_OTHER_Q).format(p=rng.choice(PLACES))
    return q, rng.choice(UNKNOWN_A)


def _statement(rng: random.Random) -> tuple[str, str]:
    q = (f"{cap(rng.choice(SUBJECTS))} {rng.choice(VERBS)} {rng.choice(['a', 'the', 'my', 'one'])} "
         f"{rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(ENDINGS)}.")
    return q, rng.choice(STATEMENT_A)


def _small_talk(rng: random.Random) -> tuple[str, str]:
    pick = rng.randrange(8)
    if pick == 0:
        return rng.choice(NAME_Q), rng.choice(SELF_INTRO)
    if pick == 1:
        return rng.choice(ABILITY_Q), rng.choice(ABILITIES)
    if pick == 2:
        g = rng.choice(GREETINGS) + rng.choice(["!", ".", "", "!"])
        return g, rng.choice(GREETING_REPLIES)
    if pick == 3:
        g = rng.choice(GREETINGS) + rng.choice(["! ", ". ", ", "])
        q = rng.choice(NAME_Q)
        q = g + (q if g.endswith(" ") and not g.endswith(", ") else q[0].lower() + q[1:])
        return q, rng.choice(["Hello! ", "Hi! ", "Hello there! "]) + rng.choice(SELF_INTRO)
    if pick == 4:
        g = rng.choice(GREETINGS) + rng.choice(["! ", ". ", ", "])
        q = rng.choice(HOW_ARE_YOU_Q)
        if rng.random() < 0.6:
            q = g + (q if not g.endswith(", ") else q[0].lower() + q[1:])
        return q, rng.choice(HOW_ARE_YOU_A)
    if pick == 5:
        return rng.choice(THANKS_Q), rng.choice(THANKS_A)
    if pick == 6:
        return rng.choice(BYE_Q), rng.choice(BYE_A)
    q = rng.choice(FEELING_Q)
    return q, FEELING_A[q]


_TOPICS: list[tuple[float, Callable[[random.Random], tuple[str, str]]]] = [
    (0.22, _small_talk), (0.18, _animal_qa), (0.10, _thing_qa), (0.08, _color_qa),
    (0.13, _number_qa), (0.09, _calendar_qa), (0.05, _opposite_qa), (0.04, _story),
    (0.03, _joke), (0.05, _unknown), (0.03, _statement),
]


def _exchange(rng: random.Random) -> tuple[str, str]:
    r, acc = rng.random(), 0.0
    for weight, fn in _TOPICS:
        acc += weight
        if r < acc:
            return fn(rng)
    return _TOPICS[-1][1](rng)


def _style(q: str, rng: random.Random) -> str:
    """Light surface variation of user turns: lower case, no final punctuation, 'please'."""
    r = rng.random()
    if r < 0.08:
        q = q.lower()
    elif r < 0.14:
        q = q.rstrip("?.!")
    elif r < 0.18 and q.endswith("."):
        q = "Please " + q[0].lower() + q[1:]
    return q


def conversation(rng: random.Random) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if rng.random() < 0.25:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = rng.choices([1, 2, 3], weights=[0.6, 0.28, 0.12])[0]
    for _ in range(turns):
        q, a = _exchange(rng)
        messages.append({"role": "user", "content": _style(q, rng)})
        messages.append({"role": "assistant", "content": a})
    return messages


def build_corpus(num_conversations: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [render(conversation(rng)) for _ in range(num_conversations)]
