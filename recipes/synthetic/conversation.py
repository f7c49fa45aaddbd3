"""Spoken-style sentences: questions, commands to a device, numbers, names and chat.

Templates have slots (`{name}`, `{n}`, ...) filled by Faker and seeded choices; numbers are
written as digits here and spelled out by normalize.py. No template has a run of six fixed words
or more, so that text.py's split (a train sentence sharing a word 6-gram with dev or eval is
dropped) cannot throw away a whole template because one of its sentences went to dev or eval.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from typing import Any

ROOMS = ["kitchen", "bedroom", "living room", "bathroom", "garage", "office", "hallway", "basement",
         "attic", "dining room", "porch", "guest room"]
THINGS = ["keys", "phone", "wallet", "glasses", "charger", "umbrella", "laptop", "passport",
          "headphones", "jacket", "notebook", "remote", "backpack", "ticket", "receipt", "car"]
PLACES = ["pharmacy", "library", "post office", "bank", "gym", "bakery", "airport", "station",
          "museum", "dentist", "hospital", "supermarket", "school", "hotel", "cinema", "park"]
GROCERIES = ["eggs", "apples", "onions", "lemons", "bananas", "potatoes", "tomatoes", "bagels",
             "cans of soup", "bottles of water", "bags of rice", "cartons of milk"]
GENRES = ["jazz", "classical", "country", "rock", "blues", "hip hop", "reggae", "folk", "soul",
          "piano", "relaxing", "dance"]
ADJECTIVES = ["slow", "loud", "expensive", "quiet", "late", "busy", "cold", "crowded", "noisy",
              "complicated", "heavy", "early"]
TASKS = ["call the plumber", "water the plants", "buy milk", "pay the rent", "feed the cat",
         "take my medicine", "book a table", "pick up the laundry", "email my boss",
         "renew my passport", "charge the car", "back up my files", "walk the dog"]
DOCS = ["report", "invoice", "contract", "slides", "spreadsheet", "letter", "budget", "schedule"]
COLORS = ["red", "blue", "green", "black", "white", "yellow", "grey", "orange", "purple", "brown"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WHEN = ["tomorrow", "tonight", "next week", "this afternoon", "later", "on the weekend", "soon",
        "in the morning", "after lunch", "next month"]
OPENERS = ["", "", "", "Well, ", "So ", "Okay, ", "Oh, ", "Hey, ", "Actually, ", "Honestly, ",
           "You know, ", "Listen, ", "Sorry, ", "Yeah, ", "Right, ", "Excuse me, "]
REPLIES = ["Yes, I think so.", "No, not really.", "Sure, why not?", "I'm not sure.", "That sounds great.",
           "Sorry, I didn't catch that.", "Hang on a second.", "No problem at all.", "Thanks a lot!",
           "I'll be right there.", "Let me check.", "That's fine by me.", "Really? Since when?",
           "I don't think so.", "Good morning!", "See you later.", "Of course.", "Are you kidding?",
           "That makes sense.", "I have no idea."]

QUESTIONS = [
    "What time does the {place} open on {day}?",
    "How many {grocery} do we need for {n} people?",
    "Did {first} call you back about the {doc}?",
    "Where did you put my {thing}?",
    "{help} {street}?",
    "Why is the {place} so {adj} today?",
    "Will it {weather} in {city} {when}?",
    "Who is picking up {first} from the {place}?",
    "Do you want the {color} one or the {color2} one?",
    "How much is a {ticket} to {city}?",
    "When is {first}'s birthday?",
    "Have you seen the {color} {thing} anywhere?",
    "Could you send me the {doc} by {day}?",
    "What's the weather like in {city}?",
    "Is {first} coming to dinner {when}?",
    "How far is {city} from here?",
    "Which floor is room {n3} on?",
    "What did {first} say about the {doc}?",
    "Are we still meeting at {time}?",
    "How old is {first} now?",
    "Can I pay {money} by card?",
    "Has anyone seen {first} {last} {when}?",
]
COMMANDS = [
    "Set a timer for {n} minutes.",
    "Remind me to {task} at {time}.",
    "Turn {onoff} the lights in the {room}.",
    "Play some {genre} music.",
    "Add {n} {grocery} to my shopping list.",
    "Send a message to {first} saying I'm running late.",
    "Turn the volume up to {n}.",
    "Set the thermostat to {temp} degrees.",
    "Open the {doc} from {day}.",
    "Navigate to {number} {street}.",
    "Wake me up at {time} {when}.",
    "Schedule a call with {first} on {day} at {time}.",
    "Call {first} {last}.",
    "Read me the {which} message from {first}.",
    "Skip to track number {n}.",
    "Show me {genre} concerts in {city}.",
    "Cancel my {time} appointment.",
    "Book a table for {small} at {time}.",
    "Lock the {room} door.",
    "Find the nearest {place}.",
    "Pause the music in the {room}.",
    "Please {task} before {day}.",
]
NUMBERS = [
    "Room {n3} is on the {ordinal} floor.",
    "My order number is {long}.",
    "The score was {small} to {small2}.",
    "I'm {age} years old.",
    "It's about {decimal} miles from here.",
    "Chapter {n}, page {n3}.",
    "We sold {big} tickets in {year}.",
    "Flight {n4} leaves from gate {n}.",
    "The code is {digits}.",
    "{small} plus {small2} makes {sum}.",
    "It was {temp} degrees on {day}.",
    "The bill came to {money}.",
    "Only {percent} of them said yes.",
    "The meeting moved to {time} on {date}.",
    "Her number is {phone}.",
    "I waited {n} minutes for the bus.",
]
CHAT = [
    "{reply}",
    "{first}, {reply_lower}",
    "I told {first} we'd be there {when}.",
    "We should ask {first} about it.",
    "That was the best {genre} concert ever.",
    "I can't find my {thing} again.",
    "{first} and {first2} are coming over {when}.",
    "Thanks so much for the {thing}.",
    "I'm not going to the {place} {when}.",
    "My {thing} stopped working {when}.",
    "Let's meet at the {place} at {time}.",
    "It's too {adj} in here.",
    "I love the new {color} {thing}.",
    "See you {when}, {first}.",
    "I just got back from {city}.",
    "{first} works at {company} now.",
]
KINDS: dict[str, list[str]] = {"question": QUESTIONS, "command": COMMANDS, "number": NUMBERS,
                               "chat": CHAT}
_SLOT = re.compile(r"\{(\w+)\}")


def ordinal(n: int) -> str:
    """21 -> 21st (normalize.py spells it: twenty first)."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def fillers(fake: Any, rng: random.Random) -> dict[str, Callable[[], str]]:
    """A function per slot name, each drawing a fresh value (`small`, `small2` and `sum` agree)."""
    def clock() -> str:
        h, m = rng.randint(1, 12), rng.choice([0, 0, 15, 30, 45, 10, 20, 40, 5, rng.randint(1, 59)])
        suffix = rng.choice(["am", "pm"] if m else ["am", "pm", "o'clock"])
        return f"{h}:{m:02d} {suffix}" if m else f"{h} {suffix}"

    a, b = rng.randint(1, 20), rng.randint(1, 20)
    return {
        "first": fake.first_name, "first2": fake.first_name, "last": fake.last_name,
        "city": fake.city, "street": fake.street_name, "company": fake.company,
        "number": lambda: str(rng.randint(1, 9999)), "place": lambda: rng.choice(PLACES),
        "thing": lambda: rng.choice(THINGS), "room": lambda: rng.choice(ROOMS),
        "grocery": lambda: rng.choice(GROCERIES), "genre": lambda: rng.choice(GENRES),
        "adj": lambda: rng.choice(ADJECTIVES), "task": lambda: rng.choice(TASKS),
        "doc": lambda: rng.choice(DOCS), "color": lambda: rng.choice(COLORS),
        "color2": lambda: rng.choice(COLORS), "day": lambda: rng.choice(WEEKDAYS),
        "when": lambda: rng.choice(WHEN), "reply": lambda: rng.choice(REPLIES),
        "reply_lower": lambda: (lambda r: r[0].lower() + r[1:])(rng.choice(REPLIES)),
        "n": lambda: str(rng.randint(2, 60)), "n3": lambda: str(rng.randint(100, 999)),
        "n4": lambda: str(rng.randint(100, 9999)), "small": lambda: str(a),
        "small2": lambda: str(b), "sum": lambda: str(a + b),
        "age": lambda: str(rng.randint(3, 95)), "temp": lambda: str(rng.randint(50, 95)),
        "big": lambda: f"{rng.randint(1000, 990000):,}", "year": lambda: str(rng.randint(1950, 2030)),
        "decimal": lambda: f"{rng.randint(1, 40)}.{rng.randint(1, 9)}",
        "long": lambda: str(rng.randint(10**5, 10**8)),
        "digits": lambda: " ".join(str(rng.randint(0, 9)) for _ in range(rng.choice((4, 6)))),
        "ordinal": lambda: ordinal(rng.randint(1, 40)), "time": clock,
        "money": lambda: rng.choice([f"${rng.randint(1, 500)}.{rng.randint(0, 99):02d}",
                                     f"${rng.randint(2, 90000):,}", f"£{rng.randint(1, 900)}"]),
        "percent": lambda: f"{rng.randint(2, 98)}%",
        "date": lambda: f"{rng.choice(WEEKDAYS)} the {ordinal(rng.randint(1, 31))}",
        "phone": lambda: fake.numerify("###-###-####"),
        "help": lambda: rng.choice(["Can you tell me how to get to", "How do I get to",
                                    "What's the fastest way to", "Is there a bus to"]),
        "weather": lambda: rng.choice(["rain", "snow", "be sunny", "be windy", "get colder"]),
        "ticket": lambda: rng.choice(["ticket", "return ticket", "flight", "train ticket", "room"]),
        "onoff": lambda: rng.choice(["off", "on"]),
        "which": lambda: rng.choice(["last", "first", "new", "latest", "long"]),
    }


def fill(template: str, slots: dict[str, Callable[[], str]]) -> str:
    """A template with each slot replaced by a fresh value."""
    return _SLOT.sub(lambda m: slots[m.group(1)](), template)


def conversation_sentences(n: int, seed: int) -> Iterator[str]:
    """N sentences: a kind (question, command, number, chat) uniformly, then a template of it; a
    casual opener on some."""
    from faker import Faker

    fake = Faker(["en_US", "en_GB"])
    fake.seed_instance(seed)
    rng = random.Random(seed)
    for _ in range(n):
        template = rng.choice(KINDS[rng.choice(sorted(KINDS))])
        text = fill(template, fillers(fake, rng))
        opener = rng.choice(OPENERS) if not template.startswith("{") else ""
        pronoun = re.match(r"I\b", text)
        yield opener + (text[0].lower() + text[1:] if opener and not pronoun else text)
