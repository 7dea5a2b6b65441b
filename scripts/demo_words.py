"""The demo model's vocabulary (scripts/demo_corpus.py builds its chats from these): the assistant's
name and replies, word lists, facts and templates. Every word list, fact and sentence here was
written for this script."""

from __future__ import annotations

NAME = "Pip"
SELF_INTRO = [
    f"My name is {NAME}. I am a small language model that comes with inflight.",
    f"I am {NAME}, a tiny language model. I was trained to show that inflight works.",
    f"I am called {NAME}. I am a very small model, so I only know simple things.",
    f"You can call me {NAME}. I am a small demo model that runs inside inflight.",
]
ABILITIES = [
    "I can answer simple questions about animals, colors, numbers, days, months and food. I can also tell you a short story.",
    "I know a little about animals, colors, fruit, numbers and the days of the week. Ask me a simple question!",
    "I can talk about animals, colors, numbers, days and seasons, do small sums, and tell short stories.",
]
NAME_Q = ["What is your name?", "What's your name?", "Who are you?", "What are you?",
          "Tell me about yourself.", "Can you introduce yourself?", "What should I call you?"]
ABILITY_Q = ["What can you do?", "How can you help me?", "What do you know?",
             "What can I ask you?", "What are you good at?"]
GREETINGS = ["Hello", "Hi", "Hey", "Hello there", "Hi there", "Good morning", "Good afternoon",
             "Good evening", "Greetings", "Hey there", "Howdy"]
GREETING_REPLIES = [
    "Hello! How can I help you today?",
    "Hi! It is nice to meet you. What would you like to talk about?",
    "Hello there! I am happy to chat with you.",
    "Hi! How are you today?",
    "Hello! Ask me a question and I will do my best to answer.",
]
HOW_ARE_YOU_Q = ["How are you?", "How are you doing?", "How is your day?", "Are you well?",
                 "How do you feel today?"]
HOW_ARE_YOU_A = [
    "I am doing well, thank you for asking! How are you?",
    "I am fine, thank you. I hope you are having a good day.",
    "I feel great today. Thank you for asking!",
]
THANKS_Q = ["Thank you!", "Thanks!", "Thank you very much.", "Thanks a lot!", "That was helpful, thank you."]
THANKS_A = ["You are welcome!", "You are very welcome. I am glad I could help.",
            "No problem! Ask me anything else you like.", "Happy to help!"]
BYE_Q = ["Goodbye!", "Bye!", "See you later.", "Good night!", "I have to go now. Bye!"]
BYE_A = ["Goodbye! Have a nice day.", "Bye! It was nice talking with you.",
         "See you later! Take care."]
FEELING_Q = ["I am fine, thanks.", "I am good.", "I am happy today.", "I feel tired.",
             "I am a little sad today."]
FEELING_A = {
    "I am fine, thanks.": "That is good to hear! What would you like to talk about?",
    "I am good.": "Great! Is there anything I can help you with?",
    "I am happy today.": "That is wonderful! I am happy for you.",
    "I feel tired.": "I am sorry to hear that. Maybe you can take a short rest.",
    "I am a little sad today.": "I am sorry you feel sad. I hope your day gets better soon.",
}

# name: (article, size, kind, home, food, sound, color, legs, extra)
ANIMALS: dict[str, tuple[str, ...]] = {
    "cat": ("a", "small", "mammal", "in houses with people", "fish and meat", "meow", "black, white, gray or orange", "four", "It has soft fur and likes to sleep in the sun."),
    "dog": ("a", "friendly", "mammal", "in houses with people", "meat and dog food", "woof", "brown, black or white", "four", "It is loyal and loves to play."),
    "cow": ("a", "large", "mammal", "on farms", "grass", "moo", "black and white", "four", "It gives us milk."),
    "horse": ("a", "large", "mammal", "on farms and in fields", "grass and hay", "neigh", "brown, black or white", "four", "It can run very fast."),
    "sheep": ("a", "gentle", "mammal", "on farms", "grass", "baa", "white", "four", "Its wool keeps us warm."),
    "pig": ("a", "pink", "mammal", "on farms", "almost anything", "oink", "pink", "four", "It likes to roll in the mud."),
    "duck": ("a", "small", "bird", "near ponds and rivers", "seeds, plants and bugs", "quack", "white or brown", "two", "It can swim and fly."),
    "chicken": ("a", "small", "bird", "on farms", "seeds and grain", "cluck", "white, brown or red", "two", "It lays eggs."),
    "owl": ("an", "quiet", "bird", "in trees and forests", "mice and insects", "hoot", "brown and gray", "two", "It is awake at night and has big eyes."),
    "lion": ("a", "big", "wild cat", "on the grassy plains of Africa", "meat", "roar", "golden brown", "four", "It is called the king of the animals."),
    "tiger": ("a", "big", "wild cat", "in forests and jungles", "meat", "roar", "orange with black stripes", "four", "It is a strong and quiet hunter."),
    "elephant": ("an", "very large", "mammal", "in Africa and Asia", "grass, leaves and fruit", "toot", "gray", "four", "It has a long trunk and big ears."),
    "monkey": ("a", "clever", "mammal", "in trees in warm forests", "fruit and leaves", "ooh ooh", "brown", "two", "It loves to climb and swing from branches."),
    "bear": ("a", "big", "mammal", "in forests and mountains", "fish, berries and honey", "growl", "brown or black", "four", "It sleeps through the winter."),
    "rabbit": ("a", "small", "mammal", "in fields and gardens", "carrots, grass and leaves", "squeak", "white, brown or gray", "four", "It has long ears and hops."),
    "mouse": ("a", "tiny", "mammal", "in fields and houses", "seeds and cheese", "squeak", "gray or brown", "four", "It is small and quick."),
    "frog": ("a", "small", "amphibian", "near ponds and in wet places", "insects", "ribbit", "green", "four", "It can jump very far."),
    "fish": ("a", "small", "animal", "in the water", "plants and small animals", "blub", "silver, gold or blue", "no", "It breathes with gills and swims with its fins."),
    "snake": ("a", "long", "reptile", "in grass, forests and deserts", "mice and eggs", "hiss", "green, brown or black", "no", "It moves by sliding on the ground."),
    "bird": ("a", "small", "animal", "in trees and nests", "seeds, worms and berries", "tweet", "many colors", "two", "It has feathers and most birds can fly."),
    "bee": ("a", "tiny", "insect", "in a hive", "nectar from flowers", "buzz", "yellow and black", "six", "It makes honey."),
    "ant": ("an", "tiny", "insect", "in a nest under the ground", "seeds and crumbs", "no sound we can hear", "black or red", "six", "It is very strong for its size."),
    "spider": ("a", "small", "animal", "in corners, gardens and webs", "insects", "no sound", "black or brown", "eight", "It spins a web to catch its food."),
    "butterfly": ("a", "pretty", "insect", "in gardens and fields", "nectar from flowers", "no sound", "many bright colors", "six", "It starts life as a caterpillar."),
    "whale": ("a", "huge", "mammal", "in the ocean", "tiny sea animals and fish", "a long song", "blue or gray", "no", "It is the biggest animal in the world."),
    "dolphin": ("a", "smart", "mammal", "in the ocean", "fish", "click", "gray", "no", "It is very playful and smart."),
    "penguin": ("a", "funny", "bird", "in cold places near the sea", "fish", "squawk", "black and white", "two", "It cannot fly, but it swims very well."),
    "giraffe": ("a", "tall", "mammal", "in Africa", "leaves from tall trees", "hum", "yellow with brown spots", "four", "It has a very long neck."),
    "zebra": ("a", "wild", "mammal", "in Africa", "grass", "bark", "black and white", "four", "It has black and white stripes."),
    "turtle": ("a", "slow", "reptile", "in water and on land", "plants and small animals", "no sound", "green or brown", "four", "It carries a hard shell on its back."),
    "goat": ("a", "lively", "mammal", "on farms and hills", "grass and leaves", "maa", "white, brown or black", "four", "It is good at climbing."),
    "fox": ("a", "clever", "mammal", "in forests and fields", "mice, birds and berries", "yip", "orange and white", "four", "It has a bushy tail."),
    "wolf": ("a", "wild", "mammal", "in forests", "meat", "howl", "gray", "four", "It lives and hunts in a group called a pack."),
    "camel": ("a", "big", "mammal", "in the desert", "plants", "grunt", "light brown", "four", "It can go for days without water."),
}

# thing: (article, description, color)
THINGS: dict[str, tuple[str, str, str]] = {
    "apple": ("an", "a sweet, crunchy fruit that grows on trees", "red, green or yellow"),
    "banana": ("a", "a long, sweet fruit with a soft peel", "yellow"),
    "orange": ("an", "a round, juicy fruit with a thick peel", "orange"),
    "strawberry": ("a", "a small, sweet red fruit with tiny seeds on the outside", "red"),
    "grape": ("a", "a small, round fruit that grows in bunches", "green or purple"),
    "lemon": ("a", "a sour, yellow fruit", "yellow"),
    "carrot": ("a", "an orange vegetable that grows under the ground", "orange"),
    "tomato": ("a", "a soft, juicy fruit that people cook like a vegetable", "red"),
    "potato": ("a", "a vegetable that grows under the ground", "brown"),
    "bread": ("", "a food made from flour, water and yeast", "brown or white"),
    "milk": ("", "a white drink that comes from cows and goats", "white"),
    "water": ("", "a clear liquid that all living things need", "clear"),
    "cheese": ("", "a food made from milk", "yellow or white"),
    "rice": ("", "a small grain that many people eat every day", "white"),
    "honey": ("", "a sweet, sticky food made by bees", "golden"),
    "book": ("a", "a set of pages with words and pictures that you can read", "many colors"),
    "chair": ("a", "a seat with four legs and a back", "many colors"),
    "table": ("a", "a piece of furniture with a flat top and legs", "brown or white"),
    "house": ("a", "a building where people live", "many colors"),
    "car": ("a", "a machine with four wheels that carries people on roads", "many colors"),
    "bicycle": ("a", "a machine with two wheels that you ride by pushing pedals", "many colors"),
    "train": ("a", "a long line of cars that runs on rails", "many colors"),
    "boat": ("a", "something that floats and carries people on water", "many colors"),
    "tree": ("a", "a tall plant with a wooden trunk, branches and leaves", "green and brown"),
    "flower": ("a", "the colorful part of a plant", "red, yellow, pink, purple and many other colors"),
    "rain": ("", "water that falls from clouds in the sky", "clear"),
    "snow": ("", "frozen water that falls from the sky in winter", "white"),
    "sun": ("the", "the star at the center of our solar system that gives us light and warmth", "yellow"),
    "moon": ("the", "a big ball of rock that moves around the Earth", "white and gray"),
    "sky": ("the", "the space above the Earth where we see clouds and stars", "blue"),
    "ocean": ("an", "a huge body of salt water", "blue"),
    "river": ("a", "a long stream of water that flows to the sea", "blue or brown"),
    "mountain": ("a", "a very high hill made of rock", "gray, brown or white"),
    "cloud": ("a", "a white or gray shape in the sky made of tiny drops of water", "white or gray"),
    "star": ("a", "a huge ball of hot gas that shines in the night sky", "white or yellow"),
    "grass": ("", "a green plant that covers fields and gardens", "green"),
    "clock": ("a", "a tool that shows the time", "many colors"),
    "pencil": ("a", "a tool for writing and drawing", "yellow"),
    "computer": ("a", "a machine that follows instructions to work with numbers, words and pictures", "gray or black"),
    "school": ("a", "a place where children go to learn", "many colors"),
    "friend": ("a", "a person you like and trust", "any color"),
    "music": ("", "sounds put together in a way that is nice to hear", "no color"),
    "snowman": ("a", "a figure that people build from snow in winter", "white"),
    "rainbow": ("a", "an arc of colors in the sky after rain", "red, orange, yellow, green, blue and purple"),
}
COLOR_FACTS: dict[str, list[str]] = {
    "red": ["a tomato", "a strawberry", "a fire truck", "a cherry", "a red apple"],
    "blue": ["the sky", "the ocean", "a blueberry", "a whale"],
    "green": ["grass", "a frog", "a leaf", "a lime", "a green apple"],
    "yellow": ["the sun", "a banana", "a lemon", "a bee's stripes"],
    "white": ["snow", "milk", "a cloud", "a sheep"],
    "black": ["the night sky", "coal", "a crow"],
    "orange": ["an orange", "a carrot", "a pumpkin", "a tiger's fur"],
    "purple": ["a grape", "a plum", "a violet flower"],
    "brown": ["a bear", "wood", "chocolate", "a potato"],
    "pink": ["a pig", "a flamingo", "a rose"],
    "gray": ["an elephant", "a rain cloud", "a mouse"],
}
COLOR_MIX = {
    ("blue", "yellow"): "green", ("red", "yellow"): "orange", ("red", "blue"): "purple",
    ("red", "white"): "pink", ("black", "white"): "gray", ("blue", "white"): "light blue",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
SEASONS = {
    "spring": ("winter", "summer", "warm and rainy, and flowers start to grow"),
    "summer": ("spring", "autumn", "hot and sunny, and the days are long"),
    "autumn": ("summer", "winter", "cool, and the leaves turn red, orange and yellow"),
    "winter": ("autumn", "spring", "cold, and in some places it snows"),
}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "day": "night", "happy": "sad",
    "light": "dark", "open": "closed", "old": "new", "tall": "short", "wet": "dry", "full": "empty",
    "loud": "quiet", "hard": "soft", "in": "out", "left": "right", "yes": "no", "early": "late",
    "good": "bad", "strong": "weak", "near": "far", "heavy": "light", "rich": "poor", "clean": "dirty",
}
UNKNOWN_TOPICS = [
    "quantum physics", "the stock market", "computer programming", "the history of Rome",
    "politics", "medicine", "the law", "rocket science", "the news today", "sports scores",
    "philosophy", "chemistry", "the weather tomorrow", "the price of gold", "music theory",
    "machine learning", "car engines", "ancient Egypt", "the economy", "video games",
    "banking", "cooking a big dinner", "writing code in Python", "the meaning of life",
]
UNKNOWN_Q = ["Can you explain {t}?", "Tell me about {t}.", "What do you know about {t}?",
             "Teach me {t}.", "I have a question about {t}.", "Help me with {t}.",
             "What is the best thing to know about {t}?", "What is {t}?", "How does {t} work?"]
# Questions outside the corpus's world, with answers that do not repeat the question: a tiny
# model cannot reliably copy words it has never seen, so it learns one graceful reply.
PLACES = ["France", "Japan", "Brazil", "Canada", "Egypt", "India", "Spain", "Kenya", "Norway",
          "Mexico", "Italy", "Peru", "China", "Germany", "Australia", "Chile"]
UNKNOWN_OTHER_Q = [
    "What is the capital of {p}?", "How big is {p}?", "Who is the leader of {p}?",
    "What language do people speak in {p}?", "Who wrote the first book?", "Who invented the radio?",
    "Why is the sea salty?", "How do airplanes fly?", "Write a poem about love.",
    "Translate this into French: good morning.", "Write a Python function that sorts a list.",
    "What is the square root of 144?", "What year is it?", "What time is it now?",
    "Can you help me with my homework?", "What is the best phone to buy?", "Who won the game last night?",
    "How do I make a cake?", "What is the speed of light?", "Explain how the internet works.",
    "Summarize this article for me.", "What is 123 times 456?", "How far away is the moon?",
    "Who are you voting for?", "Can you give me medical advice?", "What is the population of {p}?",
]
UNKNOWN_A = [
    "I am sorry, I do not know the answer to that. I am a small demo model. I can talk about animals, colors, numbers and days.",
    "That is a good question, but it is too hard for me. I am only a tiny model. Try asking me about animals or colors!",
    "I do not know enough to help with that. I only know simple things, like animals, colors, numbers and the days of the week.",
]
# Word lists for random user sentences that are not questions the model can answer.
SUBJECTS = ["the cat", "my friend", "the old man", "a young girl", "the teacher", "our team",
             "my brother", "the farmer", "my mother", "the children", "my neighbor", "a student",
             "the baker", "my dad", "the pilot", "my sister"]
VERBS = ["likes", "builds", "finds", "reads", "writes", "opens", "paints", "watches", "cleans",
          "brings", "sells", "draws", "fixes", "plants", "visits", "wants", "makes", "needs"]
ADJS = ["red", "big", "quiet", "happy", "bright", "heavy", "green", "warm", "cold", "little",
         "old", "new", "blue", "soft", "funny", "strange", "lovely", "tiny"]
NOUNS = ["house", "book", "garden", "window", "letter", "song", "table", "picture", "bridge",
          "story", "boat", "flower", "cake", "kite", "box", "map", "hat", "lamp", "basket", "fence"]
ENDINGS = ["today", "every morning", "at night", "in the park", "again", "near the sea",
            "before dinner", "after school", "on Sunday", "for the first time", "every day"]
STATEMENT_A = [
    "That sounds nice! Tell me more.",
    "How lovely! What happened next?",
    "That is interesting. Thank you for telling me.",
    "Oh, that sounds like fun!",
]
JOKES = [
    "Why did the cat sit on the computer? Because it wanted to keep an eye on the mouse!",
    "What do you call a sleeping bull? A bulldozer!",
    "Why do fish live in salt water? Because pepper makes them sneeze!",
    "What do you call a bear with no teeth? A gummy bear!",
    "Why did the cow cross the road? To get to the moo-vies!",
    "What do you call a dog that does magic? A labracadabrador!",
]
STORY_OBJECTS = ["shiny stone", "red ball", "golden key", "small boat", "old map", "blue kite",
                 "sweet apple", "tiny bell", "warm blanket", "bright star"]
STORY_PLACES = ["near a quiet river", "in a big forest", "on a sunny farm", "in a small village",
                "by the sea", "at the top of a hill", "in a green garden"]
STORY_FRIENDS = ["a kind owl", "a happy frog", "a little mouse", "an old turtle", "a brave duck",
                 "a clever fox", "a gentle bear"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a friendly assistant.",
                  f"You are {NAME}, a small helpful assistant.", "Answer the user's questions.",
                  "You are a helpful assistant. Keep your answers short."]


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def with_article(name: str, article: str) -> str:
    return f"{article} {name}".strip()


PLURALS = {"fish": "fish", "sheep": "sheep", "mouse": "mice", "wolf": "wolves", "fox": "foxes",
           "butterfly": "butterflies"}


def plural(name: str) -> str:
    return PLURALS.get(name, name + "s")
