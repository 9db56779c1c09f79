/* The course website's own script (loaded on every page by _ext/course_site.py, before the search code). */

// Search: the lesson that teaches a term ranks above the glossary and the exercise pages that mention it.
var Scorer = {
  score: function (result) {
    var docname = result[0], score = result[4];
    if (/^chapters\/\d\d_/.test(docname)) return score + 10;
    if (/^(exercises\/|chapters\/glossary)/.test(docname)) return score - 10;
    return score;
  },
  objNameMatch: 11, objPartialMatch: 6, objPrio: {0: 15, 1: 5, 2: -5}, objPrioDefault: 0,
  title: 15, partialTitle: 7, term: 5, partialTerm: 2,
};
