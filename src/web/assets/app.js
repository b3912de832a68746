/* tally's web page, the start: which view a URL shows (#/ jobs, #/tasks/{id} one job,
   #/sets, #/sets/new, #/sets/{id}, #/drafts/new and #/drafts/{id}
   "Start from photos", #/spend), then the live stream. core.js, jobs.js and
   sets.js have put their pieces on window.tally. */
"use strict";

(function (T) {
  function route() {
    if (T.view.signedOut) return;
    const hash = location.hash || "#/";
    let m;
    T.showError(null, "");
    for (const id of ["retry-dialog", "confirm-dialog", "resolve-dialog", "image-dialog"]) {
      const d = document.getElementById(id);
      if (d && d.open) d.close();
    }
    if ((m = hash.match(/^#\/tasks\/([^/]+)$/))) return T.showTask(decodeURIComponent(m[1]), true);
    if (hash === "#/sets/new") return T.showNewSet(true);
    if (hash === "#/drafts/new") return T.showNewDraft(true);
    if ((m = hash.match(/^#\/drafts\/([^/]+)$/))) return T.showDraft(decodeURIComponent(m[1]), true);
    if ((m = hash.match(/^#\/sets\/([^/]+)$/))) return T.showSet(decodeURIComponent(m[1]), true);
    if (hash === "#/sets") return T.showSets(true);
    if (hash === "#/spend") return T.showSpend(true);
    if (hash === "#/settings") return T.showSettings(true);
    return T.showJobs(true);
  }

  window.addEventListener("hashchange", route);
  T.languageSwitch();
  route();
  T.connect();
})(window.tally);
