"""The checker's engine, which every check runs on: the learner's code on real ranks (``runner``), one record per rank
(``recorder``), one rule table (``rules``, with ``branches``, ``source``, ``shards``, ``torch_errors``, ``resume``), one
verdict (``common``), the script checker's command (``script``) and the made-up GPU node (``made_up_rank``)."""
