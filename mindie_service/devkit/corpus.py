"""Built-in training corpus for the demo tokenizer.

Everything here is generated deterministically (a seeded ``random.Random`` over fixed word
lists, plus a few hand-written passages), so the trained tokenizer is the same on every
machine. It mixes English prose, dialogue, numbers, code-like lines, a little Chinese and
a few emoji: small enough that most CJK characters and emoji stay split across several
byte-level tokens, which is what the detokenizer tests want to exercise.
"""
from __future__ import annotations

import random

NAMES = ("Alice Bob Clara David Elena Farid Grace Hiro Ines Jonas Kenji Lena Mateo Nora Omar "
         "Priya Quinn Rosa Sami Tara Umar Vera Wei Xenia Yusuf Zoe Arjun Bianca Caleb Dmitri "
         "Esther Felix Greta Hassan Ingrid Julia Kofi Leila Marco Nadia Oscar Paulo Rania "
         "Stefan Tomas Ursula Viktor Wanda").split()

ADJECTIVES = ("old young quiet loud bright dark small large ancient modern gentle careful "
              "curious patient tired hungry clever brave shy proud calm busy lazy honest "
              "narrow wide heavy light warm cold wet dry green blue red yellow silver golden "
              "wooden broken hidden famous simple strange distant nearby empty crowded "
              "peaceful noisy slow fast rough smooth sharp soft bitter sweet fresh stale "
              "cheerful gloomy humble elegant sturdy fragile rusty shiny dusty polished").split()

NOUNS = ("fisherman teacher doctor farmer baker painter sailor engineer student musician "
         "merchant gardener librarian pilot carpenter nurse writer scientist shepherd "
         "cat dog horse fox owl river mountain forest village city bridge tower garden "
         "market harbor library kitchen window door table chair lamp book letter map "
         "clock bicycle train boat ship road field lake island valley castle temple "
         "machine computer network server engine signal battery circuit program question "
         "answer story song poem painting recipe journey festival storm winter summer "
         "autumn spring morning evening candle blanket basket bottle mirror ladder "
         "telescope compass lantern notebook pencil umbrella violin piano drum").split()

VERBS = ("opened closed found lost carried painted repaired visited watched followed "
         "crossed climbed built measured counted remembered forgot described explained "
         "discovered borrowed returned cleaned cooked delivered designed studied tested "
         "moved lifted pushed pulled dropped collected sorted wrapped folded planted "
         "watered sold bought traded answered questioned praised ignored protected "
         "guarded photographed sketched translated recorded replaced improved checked").split()

ADVERBS = ("slowly quickly carefully quietly happily sadly eagerly calmly suddenly "
           "gradually gently boldly nervously patiently proudly silently warmly "
           "clumsily gracefully honestly loudly neatly rarely always never often").split()

PLACES = ("by the river", "near the old mill", "in the crowded market", "at the edge of the forest",
          "on top of the hill", "behind the library", "inside the train station",
          "under the bridge", "across the valley", "beside the harbor", "in a small kitchen",
          "at the end of the road", "in the middle of the square", "outside the city walls",
          "along the northern coast", "in the back room of the shop", "on the third floor",
          "between the two towers", "in the shade of a tree", "at the foot of the mountain")

TIMES = ("In the morning", "Late at night", "Before dawn", "After lunch", "On Monday",
         "Every Sunday", "During the storm", "Last winter", "Next spring", "At noon",
         "Years ago", "Yesterday", "Tomorrow", "Once upon a time", "Just before sunset",
         "In the early hours", "Around midnight", "Later that week", "Long after the war",
         "Since the festival")

CONNECTORS = ("because", "although", "while", "so", "but", "and then", "until", "after", "since",
              "even though")

TEMPLATES = (
    "{T}, the {a} {n} {v} the {a2} {n2} {p}.",
    "{N} {v} a {a} {n} {p} {because} the {n2} was {a2}.",
    "The {n} was {a}, {because} {N} had {v} it {adv}.",
    "{T}, {N} and {N2} {v} the {n} together.",
    "Why did the {a} {n} leave the {n2} {p}?",
    "{N} asked: \"Have you seen my {a} {n}?\"",
    "\"I {v} the {n} {adv},\" said {N}, \"and it was {a}.\"",
    "There is a {a} {n} {p}, and nobody knows who {v} it.",
    "{N} {adv} {v} {count} {n}s {p}.",
    "If the {n} is {a}, then the {n2} must be {a2}.",
    "Most people think the {n} is {a}, but {N} disagrees.",
    "{T} the {n2}s were {a}, {because} someone had {v} them.",
    "Nobody expected the {a} {n} to be {v} so {adv}.",
    "{N} wrote a letter about the {a} {n} and the {a2} {n2}.",
    "Please {imp} the {n} before you leave the {n2}.",
    "Step {count}: {imp} the {a} {n} and wait for the {n2}.",
    "It took {N} {count} hours to reach the {n} {p}.",
    "The {n2} {p} is {a}; the one {p2} is {a2}.",
    "{N}'s {n} isn't {a}, it's {a2}.",
    "What would you do with a {a} {n} and {count} {n2}s?",
)

IMPERATIVES = ("open close check clean move fold count paint carry return find measure label "
               "describe repair wrap water lift sort").split()

PASSAGES = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "It was a bright cold day in April, and the clocks were striking thirteen.",
    "A language model predicts the next token from the tokens that came before it.",
    "Continuous batching lets a server add new requests to a running batch at every step.",
    "The key-value cache stores attention keys and values so they need not be recomputed.",
    "Paged attention splits the cache into fixed-size blocks, much like virtual memory pages.",
    "Greedy decoding always picks the most likely token; sampling draws from the distribution.",
    "Temperature scales the logits: lower values make the output more focused and predictable.",
    "Top-k keeps the k most likely tokens, while top-p keeps the smallest set whose mass exceeds p.",
    "HTTP/1.1 200 OK, Content-Type: application/json; charset=utf-8",
    "Error 404: the requested resource could not be found on this server.",
    "Dear Sir or Madam, I am writing to ask about the status of my order #48213.",
    "Ingredients: 2 cups of flour, 1 teaspoon of salt, 3 eggs, and 250 ml of milk.",
    "Mix the flour and salt, add the eggs one at a time, then whisk in the milk slowly.",
    "The meeting has been moved to Thursday, 14 March, at 10:30 a.m. in room B-204.",
    "Q: What is the capital of France? A: The capital of France is Paris.",
    "Q: How many legs does a spider have? A: A spider has eight legs.",
    "Q: What is 12 times 12? A: 12 times 12 is 144.",
    "Roses are red, violets are blue, sugar is sweet, and so are you.",
    "To be, or not to be, that is the question.",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
    "In the beginning there was nothing, and then there was a very small light.",
    "The train to Hamburg leaves from platform 7 at 08:15 and arrives at 12:42.",
    "Remember: measure twice, cut once. Haste makes waste. Slow and steady wins the race.",
    "Thank you for your message! We'll get back to you within 2-3 business days.",
    "Warning: do not operate heavy machinery after taking this medicine.",
    "The committee approved the budget by a vote of 7 to 2, with one abstention.",
    "Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.",
    "The Earth orbits the Sun once every 365.25 days, roughly 150 million km away.",
    "Light travels at about 299,792 kilometres per second in a vacuum.",
)

CODE_LINES = (
    "def add(a, b):\n    return a + b",
    "for i in range(10):\n    print(i * i)",
    "if x > 0 and y < 0:\n    x, y = y, x",
    "import json\ndata = json.loads('{\"key\": [1, 2, 3]}')",
    "class Point:\n    def __init__(self, x: float, y: float) -> None:\n        self.x, self.y = x, y",
    "while not done:\n    done = step() or counter >= 100",
    "SELECT name, age FROM users WHERE age >= 18 ORDER BY name;",
    "{\"model\": \"llama\", \"prompt\": \"Hello\", \"max_tokens\": 16, \"stream\": true}",
    "curl -X POST http://127.0.0.1:1025/generate -d '{\"inputs\": \"hi\"}'",
    "x = [n ** 2 for n in numbers if n % 2 == 0]",
    "return {k: v for k, v in sorted(items.items())}",
    "let total = values.iter().map(|v| v * 2).sum::<i64>();",
)

DIALOGUE = (
    ("Hello! How are you today?", "I'm doing well, thank you. How can I help you?"),
    ("Can you tell me a joke?", "Why did the scarecrow win an award? Because he was outstanding in his field."),
    ("What time is it?", "I don't have a clock, but you can check the corner of your screen."),
    ("Write a short poem about the sea.", "The sea is wide, the sea is deep, it sings the sailors off to sleep."),
    ("Summarize the story in one sentence.", "A curious girl finds a hidden door and learns to be brave."),
    ("Translate 'good morning' into French.", "'Good morning' in French is 'bonjour'."),
    ("What is two plus three?", "Two plus three is five."),
    ("Give me three colors.", "Red, green, and blue."),
    ("Who wrote Hamlet?", "Hamlet was written by William Shakespeare."),
    ("Explain gravity simply.", "Gravity is the pull that makes things fall toward the ground."),
)

CHINESE = (
    "今天天气很好，我们一起去公园散步吧。",
    "他每天早上六点起床，然后去跑步。",
    "这本书非常有意思，我已经读了两遍。",
    "请问火车站怎么走？一直往前走，然后左转。",
    "我喜欢喝茶，特别是绿茶和乌龙茶。",
    "春天来了，花都开了，小鸟在树上唱歌。",
    "学习一门新的语言需要耐心和时间。",
    "你好！很高兴认识你。",
    "人工智能正在改变我们的生活方式。",
    "北京是中国的首都，上海是最大的城市。",
    "山上有一座古老的寺庙，风景非常美丽。",
    "妈妈在厨房里做饭，爸爸在看报纸。",
    "明天会下雨，记得带伞。",
    "这个问题很难，但是我们可以一起解决。",
    "他写了一封长信给远方的朋友。",
    "月亮从东边升起来了，夜晚很安静。",
)

EMOJI = (
    "Great job! 🎉🎉",
    "I love pizza 🍕 and coffee ☕.",
    "Good morning ☀️, have a nice day 😊",
    "It is raining again 🌧️☔",
    "Happy birthday 🎂🎈🎁!",
    "We did it 💪🔥",
    "Let's go to the beach 🏖️🌊",
    "Thanks a lot 🙏❤️",
    "That's hilarious 😂😂😂",
    "Rocket launch 🚀 in 3, 2, 1...",
    "Cats 🐱 and dogs 🐶 are friends.",
    "Mixed: 你好 👋 hello!",
)

_ONSETS = "b c d f g h j k l m n p r s t v w z br ch cl dr fl gr kr pl sh st th tr".split()
_VOWELS = "a e i o u ai ea ia io ou".split()
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x"]


def _made_up_word(rng: random.Random) -> str:
    """A pronounceable invented word (places, creatures) to give BPE more to merge."""
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.randint(2, 3)))


def _sentence(rng: random.Random) -> str:
    n, n2 = rng.sample(NOUNS, 2)
    a, a2 = rng.sample(ADJECTIVES, 2)
    name, name2 = rng.sample(NAMES, 2)
    p, p2 = rng.sample(PLACES, 2)
    text = rng.choice(TEMPLATES).format(
        T=rng.choice(TIMES), N=name, N2=name2, n=n, n2=n2, a=a, a2=a2, v=rng.choice(VERBS),
        adv=rng.choice(ADVERBS), p=p, p2=p2, because=rng.choice(CONNECTORS),
        count=rng.randint(2, 999), imp=rng.choice(IMPERATIVES))
    return text[0].upper() + text[1:]


def corpus_lines(seed: int = 20240501) -> list[str]:
    """The corpus, one text per entry. Fixed for a given seed (independent of the model seed)."""
    rng = random.Random(seed)
    lines: list[str] = []
    # Prose paragraphs of 2-5 templated sentences.
    for _ in range(700):
        lines.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 5))))
    lines.extend(PASSAGES)
    lines.extend(CODE_LINES)
    for user, assistant in DIALOGUE:
        lines.append(f"User: {user}\nAssistant: {assistant}")
    # Invented names in varied frames, so the larger presets still find merges to make.
    for _ in range(2000):
        w = _made_up_word(rng)
        cap = w.capitalize()
        lines.append(rng.choice((
            f"The town of {cap} lies {rng.choice(PLACES)}.",
            f"{rng.choice(NAMES)} met a {rng.choice(ADJECTIVES)} {w} {rng.choice(PLACES)}.",
            f"In {cap}, a {w} costs {rng.randint(1, 500)} coins.",
            f"{cap} {cap}! shouted the {rng.choice(NOUNS)}.",
            f"Nobody in {cap} had ever seen a {w}.",
            f"\"{cap}\" means \"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}\" in the old language.",
        )))
    # Numbers, dates and times.
    for _ in range(150):
        lines.append(rng.choice((
            f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1900, 2099)}",
            f"Order {rng.randint(10000, 99999)} shipped on day {rng.randint(1, 365)}.",
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} - {rng.choice(NAMES)} arrived.",
            f"Total: ${rng.randint(1, 9999)}.{rng.randint(0, 99):02d}",
            f"{rng.randint(1, 100)} + {rng.randint(1, 100)} = ?",
            f"Version {rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 99)} released.",
        )))
    lines.extend(CHINESE)
    lines.extend(EMOJI)
    return lines
