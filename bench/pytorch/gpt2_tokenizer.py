"""tiktoken's "gpt2" encoding built from GPT-2's own files in a folder
(encoder.json and vocab.bpe), for machines that cannot fetch them."""
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_encoding(folder):
    ranks = data_gym_to_mergeable_bpe_ranks(folder + "/vocab.bpe", folder + "/encoder.json")
    return tiktoken.Encoding("gpt2", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
