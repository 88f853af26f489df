"""Chat prompts for distilling the SmolLM2 draft, and the held-out prompts it is measured on.

Training prompts are built from task templates crossed with topics (deterministic, seeded). The held-out prompts
(`HELD_OUT`) are written by hand on topics and tasks that never appear in the training list; the model card's
evaluation and `python -m specdemo bench --pair smollm2-135m` use them.
"""

from __future__ import annotations

import json
import random
import re

from specdemo.config import ASSETS

TOPICS = """
the water cycle; volcanoes; the moon; photosynthesis; the human heart; honeybees; the Roman Empire; the printing press;
electric cars; recycling; the Amazon rainforest; black holes; the immune system; coffee; chess; the Great Wall of China;
dinosaurs; the internet; solar panels; whales; the Olympic Games; earthquakes; vaccines; the pyramids of Giza; rainbows;
democracy; climate change; the piano; octopuses; bread baking; the French Revolution; glaciers; DNA; the stock market;
sleep; the Silk Road; tornadoes; penguins; the telephone; gardening; the Renaissance; magnets; the Sahara desert;
volunteering; marathon running; the Moon landing; tea; coral reefs; robots; friendship; libraries; trains; bicycles;
the ocean tides; the solar system; saving money; learning a new language; time management; healthy eating;
the Industrial Revolution; elephants; lightning; the Eiffel Tower; mushrooms; antibiotics; airplanes; music;
the Arctic; owls; football; the alphabet; maps; clouds; the brain; public speaking; mountains; rivers; bridges;
the camera; paper; chocolate; the seasons; batteries; spiders; the Vikings; ancient Greece; deserts; wind energy;
video games; kindness; the post office; birds migrating; fossils; the calendar; rain; the sun; cooking pasta;
the human skeleton; dogs; cats; horses; the bicycle helmet; first aid; writing a resume; job interviews;
the metric system; fractions; prime numbers; gravity; electricity; sound; light; the speed of light; atoms;
the periodic table; plastic pollution; forests; rice; the compass; castles; knights; pirates; space stations;
Mars; Jupiter; comets; telescopes; microscopes; bacteria; butterflies; frogs; sharks; dolphins; ants; trees;
flowers; snow; ice cream; pizza; the guitar; painting; photography; poetry; the theatre; museums; cities;
villages; farming; cheese; wine making; shipping containers; lighthouses; the Titanic; hot air balloons;
submarines; umbrellas; clocks; the wheel; fire; the kitchen; a birthday party; a rainy afternoon; a lost key;
a new neighbour; a school trip; a small bakery; a haunted house; a dragon; a talking cat; a robot learning to paint;
a lighthouse keeper; a time traveller; a detective; a young inventor; an old sailor; a city at night
"""

TASKS = [
    "Explain {t} in simple terms.",
    "What is {t}?",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "List five things everyone should know about {t}.",
    "Why is {t} important?",
    "Describe {t} to a ten-year-old.",
    "Write a short poem about {t}.",
    "Write a very short story about {t}.",
    "What are the advantages and disadvantages of {t}?",
    "Summarize the history of {t} in a few sentences.",
    "How does {t} work?",
    "Give me a fun fact about {t}.",
    "Write a haiku about {t}.",
    "Write a tweet about {t}.",
    "What questions would a student ask about {t}? List three.",
    "Write a two-sentence introduction to an essay about {t}.",
    "Compare {t} with something from everyday life.",
    "Tell me a short bedtime story that involves {t}.",
    "Write a friendly email to a colleague about {t}.",
    "Give step-by-step instructions for learning about {t}.",
    "What is a common misconception about {t}?",
    "Write a short dialogue between two friends about {t}.",
    "Describe {t} in one sentence.",
    "Write a product description inspired by {t}.",
    "Rewrite this sentence to sound more formal: \"{t} is really cool and everybody likes it.\"",
    "Rewrite this in plain English: \"The phenomenon of {t} is frequently misapprehended by laypersons.\"",
    "Translate the idea of {t} into a simple analogy.",
    "Write a title and an opening line for a blog post about {t}.",
    "Give me a quiz question about {t}, with the answer.",
]

# A second family, appended after the first (so that the shards already written keep their prompts): other task
# shapes and everyday topics. None of them is a held-out task or topic.
MORE_TOPICS = """
knitting; camping stoves; houseplants; origami; skateboarding; board games; yoga; jazz; podcasts; the violin;
birdwatching; pottery; rock climbing; fishing; sourdough; smoothies; a city park; a farmers market; a train station;
an airport; a hospital; a fire station; a zoo; an aquarium; a bookshop; a bakery at dawn; a snowy village;
a summer festival; a science museum; a rainforest canopy; the deep sea; a coral island; a mountain hut;
recycling plastic bottles; composting; saving water at home; walking to work; learning to swim; riding a horse;
building a sandcastle; planting a tree; writing a diary; keeping a budget; cooking rice; making tea; doing laundry;
moving to a new city; starting a club; organising a bookshelf; cleaning a bicycle; teaching a dog a trick;
the internet of things; cloud computing; spreadsheets; passwords; email etiquette; online shopping; smartphones;
3D printing; electric scooters; self-driving cars; drones; satellites; weather forecasts; earthquake drills;
the human eye; the lungs; muscles; teeth; vitamins; hydration; stretching; posture; laughter; curiosity; patience;
teamwork; leadership; honesty; creativity; gratitude; courage; a village well; a windmill; a canal boat;
a lighthouse storm; a mountain railway; a desert oasis; a snow leopard; a sea turtle; a hummingbird; a beaver dam;
a hedgehog; an old map; a message in a bottle; a secret garden; a friendly ghost; a clumsy wizard; a brave mouse
"""

MORE_TASKS = [
    "Give me some practical advice about {t}.",
    "Write a short speech about {t}.",
    "Create a short checklist about {t}.",
    "What would happen if {t} suddenly disappeared?",
    "Write a diary entry about {t}.",
    "Give me three discussion questions about {t}.",
    "Write a news headline and a one-paragraph summary about {t}.",
    "Explain {t} using a metaphor.",
    "What are two myths and two facts about {t}?",
    "Write a riddle about {t} and give the answer.",
    "Write a short lesson plan for teaching {t}.",
    "Write a children's rhyme about {t}.",
    "Describe a day in the life of someone who works with {t}.",
    "Argue for and against {t} in two short paragraphs.",
    "Write a short FAQ about {t} with three questions and answers.",
    "Explain {t} to someone from the year 1800.",
    "Write an advertisement slogan about {t}.",
    "What is the most surprising thing about {t}?",
    "Write a four-line poem about {t} that rhymes.",
    "Give me a short list of beginner mistakes with {t}, and how to avoid them.",
]

# Held out: none of these tasks or topics is in the lists above.
HELD_OUT = [
    "What is the capital of France?",
    "Name the four largest planets in our solar system.",
    "Write a short story about a fox who wants to fly.",
    "Give me a recipe for a simple tomato soup.",
    "Rewrite this sentence to be more polite: \"Send me the report now.\"",
    "List three tips for staying focused while studying.",
    "Who wrote Romeo and Juliet?",
    "Explain what a rainbow table is in computer security.",
    "Write a limerick about a forgetful wizard.",
    "What should I pack for a weekend camping trip?",
    "How many days are there in a leap year, and why?",
    "Summarize the plot of Cinderella in three sentences.",
    "Write a thank-you note to a teacher.",
    "What is the difference between weather and climate?",
    "Suggest five names for a small coffee shop.",
    "Explain how a refrigerator keeps food cold.",
    "What are the primary colors?",
    "Write a motivational message for someone starting a new job.",
    "Describe the taste of a lemon to someone who has never had one.",
    "What is the boiling point of water at sea level?",
    "Give me two ideas for a science fair project.",
    "Correct the grammar: \"She don't like going to the park on sundays.\"",
    "Why do leaves change color in autumn?",
    "Write the opening paragraph of a mystery novel set on a train.",
]

# Held out as well, for choosing among a training run's exports (`train_eagle.py select`), so that HELD_OUT, the
# bench's prompts, stays a test that no choice was made on. Forty of them: ten bench prompts judge about 700
# positions, a standard error near 0.02 on alpha, too coarse to rank heads 0.01 apart. No training prompt, templated
# or self-written, shares half its words with one of them.
SELECTION = [
    "How do bees make honey?",
    "Compose four lines of verse about snowfall at night.",
    "Which African peak is the highest, and how tall is it?",
    "Give me three ways to save money on groceries.",
    "Explain why the sky looks blue during the day.",
    "Write a short poem for my grandmother's ninetieth birthday.",
    "What does a project manager do all day?",
    "Translate \"good morning, how are you?\" into Spanish.",
    "Why do cats purr?",
    "Suggest a name for a friendly robot in a children's book.",
    "What is the main job of the kidneys?",
    "Write two sentences that describe a busy city market.",
    "How can I stop my glasses from fogging up in winter?",
    "Which artist painted The Starry Night?",
    "Explain compound interest with a simple example.",
    "Write a polite email asking a neighbour to turn down their music.",
    "What are three signs that a houseplant needs more water?",
    "Describe a sunset over the ocean in one paragraph.",
    "How does a bicycle stay upright when it moves?",
    "Tell me something surprising about octopuses.",
    "How are viruses unlike bacteria?",
    "A dragon asks a librarian for a book: write their conversation.",
    "What should I do if I burn my finger while cooking?",
    "How would you explain an API to a child?",
    "List four board games that a family of five can play together.",
    "Why is the Dead Sea so salty?",
    "Write a product description for a reusable water bottle.",
    "How long does it take light from the Sun to reach Earth?",
    "What are the rules of tic-tac-toe?",
    "Give me a simple stretching routine for after a long run.",
    "What causes thunder?",
    "Write an invitation to a picnic in the park on Saturday.",
    "How do I politely say no to extra work from my boss?",
    "What language is spoken in Brazil, and why?",
    "Walk me through how rain forms, step by step.",
    "Write a riddle whose answer is a shadow.",
    "What is a good first pet for a small apartment?",
    "Why do we have leap seconds?",
    "Describe how to make a paper airplane that flies far.",
    "What is one habit that helps people sleep better?",
]


# A third family, written by the target itself (self-instruct, Wang et al. 2023, arXiv:2212.10560): shown a few
# training prompts as a list, it continues the list (`python scripts/train_eagle.py prompts`). Its messages have
# shapes and topics that no template above has, which is what a head trained on templated prompts lacks. They are
# kept as written (plain text, committed), minus the lines `clean_prompt` rejects.
SELF_PROMPTS = ASSETS / "training" / "smollm2-135m" / "self_prompts.json"


def normalized(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def clean_prompt(line: str, seen: set[str]) -> str | None:
    """A line the target wrote as a list item -> a prompt, or None: too short or long, not ending as a sentence,
    a repeat (of an earlier one or a training prompt, both in `seen`) or close to a held-out prompt (half its words or
    more in common: HELD_OUT and SELECTION stay unseen, in substance as well as verbatim)."""
    text = line.strip().lstrip("-*0123456789. ").strip()
    words = text.split()
    if not 3 <= len(words) <= 40 or text[-1] not in ".?!\"" or "http" in text or "@" in text:
        return None
    key = normalized(text)
    if key in seen or any(similar(key, h) for h in HELD_OUT_KEYS):
        return None
    return text


def similar(a: str, b: str, limit: float = 0.5) -> bool:
    """Word-set overlap (Jaccard) of two normalized texts reaches `limit`, or one contains the other."""
    wa, wb = set(a.split()), set(b.split())
    return a in b or b in a or len(wa & wb) / max(1, len(wa | wb)) >= limit


def self_prompts() -> list[str]:
    """The target's own prompts, in the order it wrote them (empty before `train_eagle.py prompts` has run)."""
    return json.loads(SELF_PROMPTS.read_text()) if SELF_PROMPTS.exists() else []


HELD_OUT_KEYS = [normalized(h) for h in HELD_OUT + SELECTION]  # what no training prompt may be close to


def crossed(tasks: list[str], topics: str, seed: int, skip: set[str]) -> list[str]:
    """Every task x topic, minus `skip`, shuffled with a fixed seed."""
    names = [t.strip() for t in topics.replace("\n", " ").split(";") if t.strip()]
    prompts = [task.format(t=topic) for task in tasks for topic in names]
    prompts = [p for p in prompts if p not in skip]
    random.Random(seed).shuffle(prompts)
    return prompts


def training_prompts(seed: int = 0) -> list[str]:
    """The first family (shards 0-82 hold its replies), then the second, appended so the first keeps its order."""
    first = crossed(TASKS, TOPICS, seed, set(HELD_OUT))
    return first + crossed(MORE_TASKS, MORE_TOPICS, seed + 1, set(HELD_OUT) | set(first))


if __name__ == "__main__":
    ps = training_prompts()
    print(len(ps), "training prompts;", len(HELD_OUT), "held out")
    print("\n".join(ps[:5]))
