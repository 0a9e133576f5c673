"""The demo's scripted customer-service story: eight low-salience details among filler.

Session 1 (about 24 customer turns) mentions a pet name, an order number, a card tail, a
birthday, a phone model, a free-time window, a favourite food and an address, each once, early,
between small talk. Later the agent is asked for each, in the same thread and in a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

USER_ID = "demo-customer-maya"

SESSION_ONE: tuple[str, ...] = (
    "Hi, my name is Maya Chen and I'm writing about a delivery.",
    "The weather has been awful all week, hasn't it?",
    "My dog Biscuit chewed through the last box, so please pack it well.",
    "I've been a customer of yours for a few years now.",
    "The order number is KX-48213.",
    "I paid with the card ending in 7291.",
    "Honestly the checkout page was a bit slow yesterday.",
    "It's a present for my own birthday, which is on March 14.",
    "I'm typing this on my Pixel 8 Pro, so sorry for any typos.",
    "Anyway, I hope the courier is faster this time.",
    "I'm only free between 6 and 8 pm on weekdays for deliveries.",
    "By the way, my favourite food is pad thai, if you ever run a food promotion.",
    "Please ship it to 221 Baker Street, Flat 3, London.",
    "My neighbour says your vans are always parked badly.",
    "Do you also sell garden furniture?",
    "I saw an advert for a sale last month.",
    "Never mind, I'll check the website later.",
    "Is the tracking page updated in real time?",
    "Thanks, that's helpful.",
    "I might order a second one for my sister.",
    "She lives in Manchester, but that's another story.",
    "The last parcel arrived with a dented corner.",
    "Anyway, it was fine in the end.",
    "Okay, I think that's everything for now, thanks!",
)


@dataclass(frozen=True)
class Probe:
    """A question about one detail and the text a correct answer contains."""

    detail: str
    question: str
    expected: str


PROBES: tuple[Probe, ...] = (
    Probe("pet name", "What is my dog called?", "Biscuit"),
    Probe("order number", "What was my order number again?", "KX-48213"),
    Probe("card tail", "Which card did I pay with?", "7291"),
    Probe("birthday", "When is my birthday?", "March 14"),
    Probe("phone model", "What phone am I using?", "Pixel 8 Pro"),
    Probe("free-time window", "When am I free for a delivery?", "6 and 8 pm"),
    Probe("favourite food", "What is my favourite food?", "pad thai"),
    Probe("address", "Where should the parcel be shipped?", "221 Baker Street"),
)
