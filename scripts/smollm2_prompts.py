"""Chat prompts for distilling the SmolLM2 draft, and the held-out prompts it is measured on.

Training prompts are built from task templates crossed with topics (deterministic, seeded). The held-out prompts
(`HELD_OUT`) are written by hand on topics and tasks that never appear in the training list; the model card's
evaluation and `python -m specdemo bench --pair smollm2-135m` use them.
"""

from __future__ import annotations

import random

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


def training_prompts(seed: int = 0) -> list[str]:
    """Every task x topic, shuffled with a fixed seed."""
    topics = [t.strip() for t in TOPICS.replace("\n", " ").split(";") if t.strip()]
    prompts = [task.format(t=topic) for task in TASKS for topic in topics]
    held = set(HELD_OUT)
    prompts = [p for p in prompts if p not in held]
    random.Random(seed).shuffle(prompts)
    return prompts


if __name__ == "__main__":
    ps = training_prompts()
    print(len(ps), "training prompts;", len(HELD_OUT), "held out")
    print("\n".join(ps[:5]))
