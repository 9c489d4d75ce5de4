"""The fine-tune pages: the form, the list, a fine-tune's live page and its loss chart."""
