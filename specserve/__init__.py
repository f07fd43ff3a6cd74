"""specserve: an LLM serving engine that speculates only when it pays."""

from specserve.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from specserve.llm import LLM
from specserve.lora import LoRARequest
from specserve.outputs import CompletionOutput, Logprob, RequestOutput
from specserve.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "LoRARequest", "SamplingParams", "StructuredOutputsParams", "RequestOutput",
           "CompletionOutput", "Logprob", "BeamSearchParams", "BeamSearchOutput",
           "BeamSearchSequence"]
