import glob,sys,json
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(glob.glob('/root/.cache/specserve/tokenizers/*')[0])
