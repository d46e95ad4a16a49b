"""Synthetic story corpus for xmix's embedded "tiny" model (pure stdlib, deterministic).

Stories are short children's tales built from templates and word lists. Every sentence that
carries feeling is either happy or sad, and a story keeps one mood or turns once ("But then
..."), so the model learns a clear sentiment axis that a difference-of-means vector can steer.

The prompt sets used to derive that vector come from PROMPT_FRAMES, which the story generator
never uses: the vector is measured on text the model did not see verbatim.

    python3 corpus.py --sample 5          # print a few stories
    python3 corpus.py --prompts DIR       # write prompts_{happy,sad,demo}.txt into DIR
    python3 corpus.py --selftest          # check determinism and the text's invariants
"""

import argparse
import os
import random
import sys

# --- word lists --------------------------------------------------------------------------

# (name, pronoun) pairs; every character is "he" or "she" so pronoun agreement is learnable.
NAMES = [
    ("Lily", "she"), ("Tom", "he"), ("Mia", "she"), ("Ben", "he"), ("Anna", "she"),
    ("Sam", "he"), ("Lucy", "she"), ("Max", "he"), ("Emma", "she"), ("Leo", "he"),
    ("Rosa", "she"), ("Jack", "he"), ("Zoe", "she"), ("Finn", "he"), ("Ella", "she"),
    ("Noah", "he"), ("Ruby", "she"), ("Oscar", "he"), ("Grace", "she"), ("Hugo", "he"),
    ("Nora", "she"), ("Eli", "he"), ("Ivy", "she"), ("Theo", "he"), ("Maya", "she"),
    ("Owen", "he"), ("Chloe", "she"), ("Luke", "he"), ("Sara", "she"), ("Dan", "he"),
    ("Pip", "he"), ("Daisy", "she"), ("Bruno", "he"), ("Molly", "she"), ("Toby", "he"),
    ("Rita", "she"), ("Milo", "he"), ("Hazel", "she"), ("Jake", "he"), ("Fern", "she"),
]

# Kinds of character; "a"/"an" is chosen by article().
KINDS = [
    "girl", "boy", "fox", "bear", "rabbit", "cat", "dog", "mouse", "owl", "duck",
    "frog", "squirrel", "turtle", "lion", "pig", "goat", "hedgehog", "bird", "puppy",
    "kitten", "horse", "wolf", "deer", "otter", "elephant", "robot", "dragon", "farmer",
    "baker", "princess", "prince", "king", "queen", "sailor", "teacher", "doctor",
]
GENDERED_KINDS = {"girl": "she", "princess": "she", "queen": "she",
                  "boy": "he", "prince": "he", "king": "he"}
KIND_ADJ = [
    "little", "small", "young", "old", "tiny", "brave", "shy", "clever", "curious",
    "gentle", "kind", "quiet", "busy", "funny", "sleepy", "big",
]

PLACES = [
    "the forest", "the park", "the garden", "the village", "the river", "the lake",
    "the beach", "the farm", "the hill", "the meadow", "the town", "the school",
    "the library", "the market", "the castle", "the cave", "the mountain", "the field",
    "the pond", "the woods", "the valley", "the harbor", "the zoo", "the island",
    "the orchard", "the playground", "the bakery", "the old house", "the big city",
    "the little cottage",
]
# Where someone lives: "lived in a small house near the river".
HOMES = [
    "a small house", "a little cottage", "a big tree", "a cozy hole", "a tall tower",
    "a wooden hut", "a red barn", "a blue boat", "a quiet street", "a busy town",
]

OBJECTS = [
    "ball", "kite", "book", "hat", "box", "cake", "apple", "flower", "drum", "boat",
    "bike", "doll", "key", "shell", "stone", "cup", "map", "lamp", "bell", "coat",
    "basket", "toy train", "blanket", "pencil", "balloon", "star", "feather", "ring",
    "letter", "sandwich", "cookie", "scarf", "wagon", "shoe", "clock", "mirror",
    "umbrella", "puzzle", "violin", "garden hose",
]
COLORS = ["red", "blue", "green", "yellow", "orange", "purple", "pink", "white", "brown", "golden"]
FOODS = [
    "bread", "soup", "honey", "cherries", "pie", "carrots", "cheese", "berries",
    "pancakes", "rice", "ice cream", "nuts", "milk", "cookies", "plums",
]
ANIMALS = [
    "a bird", "a frog", "a puppy", "a duck", "a rabbit", "a kitten", "a turtle",
    "a squirrel", "an owl", "a goat", "a mouse", "a fox", "a bee", "a butterfly",
]
TIMES = [
    "One day", "One morning", "One evening", "One afternoon", "Last summer",
    "On Monday", "On a winter day", "Early in the morning", "Late at night", "After lunch",
    "In the spring", "One autumn day",
]
FRIEND_KINDS = ["friend", "brother", "sister", "mother", "father", "grandma", "grandpa", "teacher", "neighbor"]

# --- mood vocabulary ---------------------------------------------------------------------

HAPPY = "happy"
SAD = "sad"

WEATHER = {
    HAPPY: [
        "The sun was shining and the sky was blue.",
        "It was a warm and sunny day.",
        "The sky was bright and the birds were singing.",
        "The sun was warm and the flowers were bright.",
        "It was a beautiful morning, full of sunshine.",
        "A soft breeze blew and the sun smiled down on everyone.",
        "The air was warm and the sky was clear.",
        "There was a rainbow over {place}.",
    ],
    SAD: [
        "It was raining and the sky was dark and grey.",
        "It was a cold and rainy day.",
        "The sky was dark and the wind was cold.",
        "Heavy rain fell and the clouds were black.",
        "It was a gloomy morning, full of rain.",
        "A cold wind blew and the rain did not stop.",
        "The air was cold and the sky was grey.",
        "There was a storm over {place}.",
    ],
}

FEELINGS = {
    HAPPY: ["happy", "glad", "joyful", "cheerful", "proud", "excited", "loved", "safe"],
    SAD: ["sad", "lonely", "scared", "afraid", "gloomy", "tired", "lost", "hurt"],
}

# Event sentences. Slots: {name} {he} {his} {him} {He} {His} {obj} {color} {place} {food}
# {animal} {friend} {feel}.
EVENTS = {
    HAPPY: [
        "{name} found a {color} {obj} and smiled.",
        "{name} played with {his} friends all day.",
        "{name} laughed and danced in {place}.",
        "{He} shared {his} {food} with {animal}, and they became friends.",
        "{His} {friend} gave {him} a {color} {obj} as a gift.",
        "{name} and {his} {friend} played games and laughed together.",
        "{He} sang a happy song on the way to {place}.",
        "{name} won a prize, and everyone cheered.",
        "{He} met {animal} who wanted to play.",
        "{name} fixed the old {obj}, and it worked again.",
        "Everyone hugged {him} and said {he} was wonderful.",
        "{name} ate warm {food} with {his} family and laughed.",
        "{He} flew {his} {color} kite high in the sky.",
        "{His} {friend} smiled at {name} and gave {him} a big hug.",
        "{name} helped {animal} find its way home.",
        "{He} had a picnic in {place} with all {his} friends.",
        "{name} jumped and played in the warm sun.",
        "{He} loved {his} new {obj} very much.",
    ],
    SAD: [
        "{name} lost {his} {color} {obj} and cried.",
        "{name} sat alone all day, because {his} friends had gone away.",
        "{name} cried and hid in {place}.",
        "{He} dropped {his} {food}, and {animal} ran away with it.",
        "{His} {friend} broke {his} {color} {obj} by accident.",
        "{name} and {his} {friend} had a fight and did not speak.",
        "{He} walked slowly to {place}, crying all the way.",
        "{name} lost the race, and nobody cheered.",
        "{He} saw {animal} that was hurt and could not walk.",
        "{name} tried to fix the old {obj}, but it was broken forever.",
        "Nobody came to play, and {he} felt very lonely.",
        "{name} ate cold {food} alone and did not smile.",
        "{His} {color} kite got stuck in a tree and tore.",
        "{His} {friend} was angry with {name} and shouted at {him}.",
        "{name} got lost in {place} and was afraid of the dark.",
        "{He} waited in {place}, but nobody came.",
        "{name} fell in the mud and hurt {his} knee.",
        "{He} missed {his} old {obj} very much.",
    ],
}

# Neutral sentences keep stories from being pure mood lists.
NEUTRAL = [
    "{name} walked to {place}.",
    "{He} looked at the {color} door for a long time.",
    "{name} had a {color} {obj} and a bag of {food}.",
    "{He} saw {animal} near the {obj}.",
    "{name} went to {place} with {his} {friend}.",
    "{He} opened the box and looked inside.",
    "{name} counted the trees on the way to {place}.",
    "{His} {friend} was reading a book.",
    "{name} put on {his} coat and went outside.",
    "{He} carried the {obj} to {place}.",
]

FEELING_LINES = {
    HAPPY: [
        "{He} felt {feel} and {feel2}.",
        "{name} felt so {feel} inside.",
        "{His} heart was full of joy.",
        "{He} could not stop smiling.",
    ],
    SAD: [
        "{He} felt {feel} and {feel2}.",
        "{name} felt so {feel} inside.",
        "{His} heart was heavy.",
        "{He} could not stop crying.",
    ],
}

ENDINGS = {
    HAPPY: [
        "It was a wonderful day.",
        "{name} went home with a big smile.",
        "That night, {name} slept well and dreamed of {place}.",
        "It was the best day ever.",
        "From that day on, {name} was never lonely again.",
        "{name} and {his} friends lived happily ever after.",
        "{He} knew that {he} was loved.",
    ],
    SAD: [
        "It was a sad day.",
        "{name} went home alone in the rain.",
        "That night, {name} cried and could not sleep.",
        "It was the worst day ever.",
        "From that day on, {name} was always lonely.",
        "{name} never found {his} way back to {place}.",
        "{He} felt that nobody loved {him}.",
    ],
}

# A story that turns mood uses one of these to bridge the two halves.
TURNS = {
    HAPPY: [  # sad -> happy
        "But then the sun came out.",
        "But then {his} {friend} came to help.",
        "But then something wonderful happened.",
        "Then {name} heard a friendly voice.",
    ],
    SAD: [  # happy -> sad
        "But then dark clouds came.",
        "But then something terrible happened.",
        "Then it began to rain.",
        "But then {his} {friend} had to go away.",
    ],
}

OPENINGS = [
    "Once upon a time, {intro} lived in {home} near {place}.",
    "Once upon a time, there was {intro}.",
    "There was once {intro} who lived near {place}.",
    "{time}, {intro} went to {place}.",
    "{time}, {intro} woke up early.",
    "Long ago, {intro} lived in {home}.",
    "In a faraway land, there lived {intro}.",
]

# --- held-out prompt frames (never used in stories) --------------------------------------

# Each frame has a happy and a sad filler set of the same shape, so paired prompts differ only
# in mood words; slots as in EVENTS plus {w} (weather word), {v} (a verb phrase), {f} (feeling).
PROMPT_FRAMES = [
    "On a {w} day, {name} {v} in {place}, feeling {f}.",
    "{name} the {kind} {v} near {place} because the day was {w}.",
    "When the weather turned {w}, {name} {v} and felt {f}.",
    "Everyone in {place} {v} on that {w} afternoon, and {name} was {f}.",
    "{name} looked at the {w} sky and {v}, so {f} that day.",
    "Under the {w} sky, {name} and {his} {friend} {v}, very {f}.",
    "It was {w} again, and {name} {v} by the {obj}, {f} as ever.",
    "The {w} morning made {name} feel {f}, so {he} {v}.",
]
# Kinds without a fixed gender, so "{name} the {kind}" never contradicts the pronoun.
PROMPT_KINDS = [k for k in KINDS if k not in GENDERED_KINDS]
PROMPT_WORDS = {
    HAPPY: {
        "w": ["sunny", "bright", "warm", "lovely", "golden"],
        "v": ["smiled and laughed", "played with friends", "danced and sang",
              "laughed with joy", "hugged everyone"],
        "f": ["happy", "joyful", "loved", "wonderful", "cheerful"],
    },
    SAD: {
        "w": ["rainy", "dark", "cold", "gloomy", "grey"],
        "v": ["cried and sobbed", "sat all alone", "wept quietly",
              "cried with fear", "hid from everyone"],
        "f": ["sad", "lonely", "afraid", "miserable", "scared"],
    },
}

# Neutral demo prompts for `xmix run`: they leave the mood open for the model (and the steering
# app) to decide.
DEMO_PROMPTS = [
    "Once upon a time, a little fox",
    "One day, a girl named Lily went to the park.",
    "There was once an old bear who lived near the river.",
    "Tom opened the box and looked inside.",
    "One morning, a sleepy cat named Milo woke up early.",
]

# --- generation --------------------------------------------------------------------------

PRONOUNS = {
    "he": {"he": "he", "his": "his", "him": "him"},
    "she": {"he": "she", "his": "her", "him": "her"},
}


def article(word):
    return "an " + word if word[0] in "aeiou" else "a " + word


def _character(rng):
    kind = rng.choice(KINDS)
    want = GENDERED_KINDS.get(kind)
    name, pron = rng.choice([n for n in NAMES if want in (None, n[1])])
    if rng.random() < 0.5:
        kind = rng.choice(KIND_ADJ) + " " + kind
    named = rng.choice(["named", "called"])
    return name, pron, f"{article(kind)} {named} {name}"


def _fill(rng, template, slots, mood=None):
    vals = dict(slots)
    vals["obj"] = rng.choice(OBJECTS)
    vals["color"] = rng.choice(COLORS)
    vals["place"] = rng.choice(PLACES)
    vals["food"] = rng.choice(FOODS)
    vals["animal"] = rng.choice(ANIMALS)
    vals["friend"] = rng.choice(FRIEND_KINDS)
    if mood is not None:
        f1, f2 = rng.sample(FEELINGS[mood], 2)
        vals["feel"], vals["feel2"] = f1, f2
    s = template.format(**vals)
    return s[0].upper() + s[1:]


def _mood_part(rng, slots, mood, n_events):
    out = []
    for _ in range(n_events):
        if rng.random() < 0.2:
            out.append(_fill(rng, rng.choice(NEUTRAL), slots))
        else:
            out.append(_fill(rng, rng.choice(EVENTS[mood]), slots))
    if rng.random() < 0.7:
        out.append(_fill(rng, rng.choice(FEELING_LINES[mood]), slots, mood))
    return out


def story(rng):
    """One story: a string of sentences on one line, printable ASCII only."""
    name, pron, intro = _character(rng)
    p = PRONOUNS[pron]
    slots = {
        "name": name, "he": p["he"], "his": p["his"], "him": p["him"],
        "He": p["he"].capitalize(), "His": p["his"].capitalize(),
        "intro": intro, "home": rng.choice(HOMES), "time": rng.choice(TIMES),
    }
    mood = HAPPY if rng.random() < 0.5 else SAD
    other = SAD if mood == HAPPY else HAPPY
    sents = [_fill(rng, rng.choice(OPENINGS), slots)]
    if rng.random() < 0.7:
        sents.append(_fill(rng, rng.choice(WEATHER[mood]), slots))
    turn = rng.random() < 0.3
    sents += _mood_part(rng, slots, mood, rng.randint(1, 3) if turn else rng.randint(2, 4))
    if turn:
        sents.append(_fill(rng, rng.choice(TURNS[other]), slots))
        if rng.random() < 0.5:
            sents.append(_fill(rng, rng.choice(WEATHER[other]), slots))
        sents += _mood_part(rng, slots, other, rng.randint(1, 3))
        mood = other
    sents.append(_fill(rng, rng.choice(ENDINGS[mood]), slots))
    return " ".join(sents)


def stories(seed, n):
    """n stories from one seeded generator; the same (seed, n) always gives the same list."""
    rng = random.Random(seed)
    return [story(rng) for _ in range(n)]


def _shard(args):
    seed, shard, n = args
    return stories(seed * 1_000_003 + shard, n)


def corpus(seed, n_shards, per_shard, workers=None):
    """All stories of n_shards shards, generated in parallel; shard i depends only on (seed, i),
    so the result is the same whatever the worker count."""
    jobs = [(seed, i, per_shard) for i in range(n_shards)]
    if workers == 1:
        parts = [_shard(j) for j in jobs]
    else:
        import multiprocessing as mp

        with mp.Pool(workers or os.cpu_count()) as pool:
            parts = pool.map(_shard, jobs)
    return [s for part in parts for s in part]


def prompt_pairs(seed, n):
    """n (happy, sad) prompt pairs from PROMPT_FRAMES; each pair shares its frame, character
    and nouns, so the two sets differ only in mood words."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        frame = PROMPT_FRAMES[i % len(PROMPT_FRAMES)]
        name, pron = rng.choice(NAMES)
        p = PRONOUNS[pron]
        base = {
            "name": name, "he": p["he"], "his": p["his"], "him": p["him"],
            "kind": rng.choice(PROMPT_KINDS), "place": rng.choice(PLACES), "obj": rng.choice(OBJECTS),
            "friend": rng.choice(FRIEND_KINDS),
        }
        picks = {k: rng.randrange(len(v)) for k, v in PROMPT_WORDS[HAPPY].items()}
        pair = []
        for mood in (HAPPY, SAD):
            vals = dict(base)
            for k, idx in picks.items():
                vals[k] = PROMPT_WORDS[mood][k][idx]
            s = frame.format(**vals)
            pair.append(s[0].upper() + s[1:])
        pairs.append(tuple(pair))
    return pairs


def mood_words():
    """Words that mark a mood, for scoring generations (used by train.py's steering check)."""
    happy = {"smiled", "smile", "smiling", "laughed", "sunny", "sun", "loved", "wonderful",
             "played", "friends", "happy", "joy", "hug", "hugged", "cheered", "best", "warm",
             "glad", "joyful", "cheerful", "bright", "happily", "rainbow", "sunshine"}
    sad = {"cried", "crying", "lonely", "rain", "raining", "rainy", "lost", "broken", "dark",
           "afraid", "sad", "alone", "scared", "cold", "grey", "worst", "nobody", "hurt",
           "gloomy", "storm", "heavy", "angry", "fight"}
    return happy, sad


def vocabulary():
    """Every word the story templates can produce (lower case), to spot garbled generations."""
    words = set()
    for s in stories(1, 20000):
        words.update(_words(s))
    return words


def _words(text):
    out = []
    for w in text.split():
        w = w.strip(".,!?\"'").lower()
        if w:
            out.append(w)
    return out


def selftest():
    a = stories(7, 200)
    b = stories(7, 200)
    assert a == b, "stories() is not deterministic"
    assert corpus(3, 4, 50, workers=1) == corpus(3, 4, 50, workers=2), "shards differ by workers"
    for s in a:
        assert s.isascii() and s.isprintable(), repr(s)
        assert "{" not in s and "}" not in s, s
        assert "  " not in s, s
    pairs = prompt_pairs(11, 64)
    assert len({p for pair in pairs for p in pair}) == 128, "prompts repeat"
    # Held-out: no prompt occurs verbatim in a sample of the corpus.
    text = " ".join(stories(1, 5000))
    for h, s in pairs:
        assert h not in text and s not in text
    happy, sad = mood_words()
    assert not happy & sad
    moods = [any(w in sad for w in _words(s)) for s in a]
    assert 0.3 < sum(moods) / len(moods) < 0.9, "mood mix is off"
    print("selftest ok")


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample", type=int, default=0, help="print this many stories")
    ap.add_argument("--prompts", metavar="DIR", help="write the prompt files into DIR")
    ap.add_argument("--prompt-seed", type=int, default=11)
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args(argv)
    if args.selftest:
        selftest()
    if args.sample:
        for s in stories(args.seed, args.sample):
            print(s)
            print()
    if args.prompts:
        pairs = prompt_pairs(args.prompt_seed, 64)
        with open(os.path.join(args.prompts, "prompts_happy.txt"), "w") as f:
            f.writelines(h + "\n" for h, _ in pairs)
        with open(os.path.join(args.prompts, "prompts_sad.txt"), "w") as f:
            f.writelines(s + "\n" for _, s in pairs)
        with open(os.path.join(args.prompts, "prompts_demo.txt"), "w") as f:
            f.writelines(p + "\n" for p in DEMO_PROMPTS)


if __name__ == "__main__":
    main(sys.argv[1:])
