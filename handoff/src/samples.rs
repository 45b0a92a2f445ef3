//! Sample prompts for calibrating and evaluating handoff algorithms: open-ended prompts (the
//! small model's confidence on them sets the confidence gate's threshold; agreement with the
//! large model is measured on them) and questions with one right answer.

/// Open-ended prompts, raw text (no chat template), each a few words to continue.
pub const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "The best way to learn a new language is",
    "In the year 1969, astronauts",
    "A healthy breakfast usually includes",
    "The main function of the heart is to",
    "To make a cup of tea, first you",
    "The largest planet in our solar system is",
    "Photosynthesis is the process by which plants",
    "My favorite thing about the weekend is",
    "The internet has changed the way people",
    "A good friend is someone who",
    "The Pacific Ocean is",
    "In computer science, a variable is",
    "The story begins on a cold winter morning when",
    "Exercise is important because",
    "The Eiffel Tower was built in",
    "Dogs are popular pets because they",
    "The sun rises in the east and",
    "A recipe for chocolate cake needs",
    "The first step in solving a math problem is",
    "Rain forms when water vapor",
    "The library was quiet except for",
    "Electric cars are becoming more common because",
    "The human brain is responsible for",
    "On the first day of school, the children",
    "Mount Everest is the",
    "Music can make people feel",
    "The old man looked at the map and said",
    "A triangle has three sides and",
    "The moon orbits the Earth and",
    "When you plant a seed, it needs",
    "The city at night was full of",
    "Recycling helps the environment by",
];

/// A question with one right answer: `prompt` is raw text whose continuation should contain
/// `answer` (matched case-insensitively on the generated text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Question {
    /// Text to continue.
    pub prompt: &'static str,
    /// The answer the continuation must contain.
    pub answer: &'static str,
}

/// Questions with one right answer.
pub const QUIZ: &[Question] = &[
    Question {
        prompt: "Question: What is the capital of France?\nAnswer: The capital of France is",
        answer: "paris",
    },
    Question {
        prompt: "Question: What is the capital of Japan?\nAnswer: The capital of Japan is",
        answer: "tokyo",
    },
    Question {
        prompt: "Question: How many days are in a week?\nAnswer: A week has",
        answer: "seven",
    },
    Question {
        prompt: "Question: What color is the sky on a clear day?\nAnswer: The sky is",
        answer: "blue",
    },
    Question {
        prompt: "Question: What is the largest planet in the solar system?\nAnswer: The largest planet is",
        answer: "jupiter",
    },
    Question {
        prompt: "Question: What do bees make?\nAnswer: Bees make",
        answer: "honey",
    },
    Question {
        prompt: "Question: What is frozen water called?\nAnswer: Frozen water is called",
        answer: "ice",
    },
    Question {
        prompt: "Question: Which animal is known as the king of the jungle?\nAnswer: The king of the jungle is the",
        answer: "lion",
    },
    Question {
        prompt: "Question: What is the opposite of hot?\nAnswer: The opposite of hot is",
        answer: "cold",
    },
    Question {
        prompt: "Question: What gas do humans need to breathe?\nAnswer: Humans need to breathe",
        answer: "oxygen",
    },
    Question {
        prompt: "Question: On which continent is Egypt?\nAnswer: Egypt is in",
        answer: "africa",
    },
    Question {
        prompt: "Question: What is the capital of Italy?\nAnswer: The capital of Italy is",
        answer: "rome",
    },
];
