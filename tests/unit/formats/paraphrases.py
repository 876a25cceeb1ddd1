"""Sentence pairs that mean the same, for the retrieval check: each first sentence should find its own
second sentence as the nearest of all second sentences (hand-written, varied topics and lengths)."""

from __future__ import annotations

import numpy as np

PAIRS = [
    ("A man is playing a guitar on stage.", "Someone performs a song with a guitar in front of an audience."),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch."),
    ("How do I reset my password?", "What are the steps to change a forgotten password?"),
    ("The stock market fell sharply today.", "Share prices dropped steeply in today's trading."),
    ("She is cooking pasta for dinner.", "She's making spaghetti for the evening meal."),
    ("The train to Berlin is delayed by an hour.", "The Berlin train will arrive sixty minutes late."),
    ("Drink plenty of water when it is hot.", "Stay hydrated during hot weather."),
    ("The children are building a sandcastle on the beach.", "Kids make a castle out of sand by the sea."),
    ("My laptop battery drains very quickly.", "The battery on my notebook computer runs out fast."),
    ("He scored the winning goal in the final minute.", "His last-minute goal won the match."),
    ("The museum is closed on Mondays.", "You cannot visit the museum on a Monday."),
    ("Turn left at the second traffic light.", "At the second set of lights, make a left turn."),
    ("The recipe needs two cups of flour.", "You need 2 cups of flour for this recipe."),
    ("It is going to rain tomorrow afternoon.", "Rain is expected tomorrow after midday."),
    ("The company hired fifty new engineers.", "Fifty engineers joined the firm."),
    ("Please send me the report by Friday.", "I need the report from you before the end of the week."),
    ("The patient was given antibiotics for the infection.", "Doctors treated the infection with antibiotics."),
    ("The flight was cancelled because of the storm.", "The storm led to the flight being called off."),
    ("Electric cars are becoming more popular.", "More and more people are buying electric vehicles."),
    ("The library has thousands of old manuscripts.", "Many ancient handwritten documents are kept in the library."),
    ("He forgot his keys at the office.", "He left his keys behind at work."),
    ("The concert tickets sold out in minutes.", "All tickets for the show were gone almost immediately."),
    ("Water boils at one hundred degrees Celsius.", "At 100 °C water starts to boil."),
    ("The baby started crying in the middle of the night.", "In the night the infant woke up and cried."),
    ("Our team won the championship last year.", "Last season we were the champions."),
    ("The printer is out of paper.", "There is no paper left in the printer."),
    ("She speaks three languages fluently.", "She is fluent in three different languages."),
    ("The bridge was closed for repairs.", "Repair work shut the bridge."),
    ("Exercise regularly to stay healthy.", "Regular workouts keep you in good health."),
    ("The new phone has an excellent camera.", "This latest smartphone takes great photos."),
    ("The meeting has been moved to Thursday.", "We rescheduled the meeting for Thursday."),
    ("The dog barked at the mail carrier.", "The postman was barked at by the dog."),
    ("Prices for apartments in the city keep rising.", "Urban housing is getting more and more expensive."),
    ("I can't find my glasses anywhere.", "My spectacles seem to have disappeared."),
    ("The volcano erupted last night.", "Last night there was a volcanic eruption."),
    ("The software update fixed the security bug.", "The vulnerability was patched in the latest update."),
    ("They planted tomatoes in the garden.", "Tomato plants were put in the garden bed."),
    ("The river flooded the village.", "The village was underwater after the river overflowed."),
    ("He is learning to play the piano.", "He is taking piano lessons."),
    ("The restaurant serves vegetarian dishes.", "Meat-free meals are on the restaurant's menu."),
]


def top1(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Index of each query's nearest candidate by cosine (embeddings are unit length)."""
    return (np.asarray(queries) @ np.asarray(candidates).T).argmax(axis=1)
