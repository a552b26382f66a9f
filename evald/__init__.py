"""evald's root: what ``daemon``, ``inference`` and ``storage`` share although none imports another's."""
